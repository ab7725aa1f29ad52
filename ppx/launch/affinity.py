"""CPU pinning for CPU runs: each local rank gets its own block of the CPUs the job may use.

Without it, the thread that gloo wakes when a message lands can preempt a neighbour rank's
compute on a shared CPU while another CPU idles, and the preempted rank waits for the next
scheduler tick to move (stalls inside a send; the measurements are in docs/benchmarks.md,
"Measurements behind design choices"). Ranks keep to their block, threads included, since
gloo's threads start after pinning and inherit it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def cpu_block(local_rank: int, local_world: int, cpus: Sequence[int]) -> list[int]:
    """CPUs for ``local_rank`` of ``local_world``: consecutive, equal blocks of ``cpus``
    (sorted). With more ranks than CPUs, ranks share CPUs round robin (ranks 0,2 | 1,3 of 4 on
    2 CPUs), so pipeline neighbours never share one: a hand-off wakes the receiver on another
    CPU instead of queueing it behind its sender, which is busy posting at that very moment
    (measured against neighbours sharing a CPU: docs/benchmarks.md)."""
    cpus = sorted(cpus)
    n = len(cpus)
    if local_world <= n:
        return cpus[local_rank * n // local_world : (local_rank + 1) * n // local_world]
    return [cpus[local_rank % n]]


def pin_order(rank: int, world: int, local_rank: int, local_world: int, data: int) -> int:
    """This rank's place among its node's ranks for `cpu_block`: replica by replica, then by
    pipeline rank (the job numbers ranks pipeline rank x ``data`` + replica, so by local rank
    round robin would put a replica's pipeline neighbours, ``data`` apart, on one CPU). The
    node's ranks are the ``local_world`` from ``rank - local_rank`` on, as torchrun numbers them."""
    from ppx.engine.data_parallel import Layout

    if data <= 1:
        return local_rank
    first = rank - local_rank
    layouts = [Layout(world // data, data, g) for g in range(first, first + local_world)]
    return sorted(layouts, key=lambda x: (x.dp_rank, x.pp_rank)).index(Layout(world // data, data, rank))


def pin_local_rank(order: int, local_world: int) -> list[int]:
    """Pin this process to the block of its place ``order`` (`pin_order`) among the CPUs it may
    use now; returns the block."""
    block = cpu_block(order, local_world, sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, block)
    return block


def describe(cpus: Sequence[int]) -> str:
    """ "0-3,8" for [0, 1, 2, 3, 8]."""
    out, cpus = [], sorted(cpus)
    k = 0
    while k < len(cpus):
        j = k
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[k]) if j == k else f"{cpus[k]}-{cpus[j]}")
        k = j + 1
    return ",".join(out)
