"""Align every rank's ``perf_counter`` clock with rank 0's (Cristian's algorithm).

Each rank exchanges a few timestamps with rank 0 and keeps the offset measured on the
round trip with the smallest latency; the error is at most half that round trip (tens of
microseconds on one host, where the monotonic clock is shared and the offset is ~0).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def offset_to_rank0(group=None, rounds: int = 8) -> float:
    """Seconds to add to this rank's ``time.perf_counter()`` to get rank 0's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.zeros(1, dtype=torch.float64)
    best = (float("inf"), 0.0)
    for peer in range(1, world):
        for _ in range(rounds):
            if rank == 0:
                dist.recv(buf, src=peer, group=group)
                buf[0] = time.perf_counter()
                dist.send(buf, dst=peer, group=group)
            elif rank == peer:
                t1 = time.perf_counter()
                buf[0] = t1
                dist.send(buf, dst=0, group=group)
                dist.recv(buf, src=0, group=group)
                t2 = time.perf_counter()
                best = min(best, (t2 - t1, float(buf[0]) - (t1 + t2) / 2))
    return best[1] if rank != 0 else 0.0


SPIN_S = 0.00025  # the last 0.25 ms is spun, not slept: sleep wake-ups come 0.1-0.2 ms late (p90 on a 2-vCPU VM)


def sleep_until(deadline: float) -> None:
    """Sleep to just short of ``deadline`` (perf_counter seconds), then yield-spin to it:
    plain sleeps wake 0.1-1 ms late, and yielding keeps spinning ranks off busy cores."""
    left = deadline - time.perf_counter()
    if left > SPIN_S:
        time.sleep(left - SPIN_S)
    while time.perf_counter() < deadline:
        os.sched_yield()


def start_together(offset: float, group=None, margin_s: float = 0.005) -> None:
    """Begin the next step on every rank at the same instant: rank 0 picks a start time
    ``margin_s`` ahead on its clock, and each rank sleeps until then on its own clock.
    Also a barrier: rank 0 reaches it only after every rank has reported its last step."""
    box = torch.zeros(1, dtype=torch.float64)
    if dist.get_rank() == 0:
        box[0] = time.perf_counter() + margin_s
    dist.broadcast(box, src=0, group=group)
    sleep_until(float(box[0]) - offset)
