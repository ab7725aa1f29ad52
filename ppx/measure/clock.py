"""Align every rank's ``perf_counter`` clock with rank 0's (Cristian's algorithm).

Ranks on rank 0's host share its clock: ``perf_counter`` is CLOCK_MONOTONIC, one clock per
booted kernel, so their offset is exactly 0. A rank on another host exchanges a few timestamps
with rank 0 and keeps the offset measured on the round trip with the smallest latency; the
error is at most half that round trip.
"""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

from ppx.models.action_clock import sleep_until


def host_clock_id() -> str:
    """Names this host's monotonic clock: the kernel's boot id (hostname where it is missing)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def offset_to_rank0(group=None, rounds: int = 8, clock_id: str | None = None, now=time.perf_counter) -> float:
    """Seconds to add to this rank's ``time.perf_counter()`` to get rank 0's: 0 on rank 0's
    host (the same clock; a round-trip estimate there would only add its error, up to a
    millisecond on busy CPUs), measured by round trips elsewhere. ``clock_id`` and ``now``
    stand in for this host's clock name and clock (tests)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    clocks = [None] * world
    dist.all_gather_object(clocks, clock_id or host_clock_id(), group=group)
    remote = [r for r in range(1, world) if clocks[r] != clocks[0]]
    buf = torch.zeros(1, dtype=torch.float64)
    best = (float("inf"), 0.0)
    for peer in remote:
        for _ in range(rounds):
            if rank == 0:
                dist.recv(buf, src=peer, group=group)
                buf[0] = now()
                dist.send(buf, dst=peer, group=group)
            elif rank == peer:
                t1 = now()
                buf[0] = t1
                dist.send(buf, dst=0, group=group)
                dist.recv(buf, src=0, group=group)
                t2 = now()
                best = min(best, (t2 - t1, float(buf[0]) - (t1 + t2) / 2))
    return best[1] if rank != 0 else 0.0


def start_together(offset: float, group=None, margin_s: float = 0.005) -> float:
    """Begin the next step on every rank at the same instant, a barrier too: each rank proposes
    ``margin_s`` after its arrival (on rank 0's clock), the latest proposal wins, and each rank
    sleeps until it on its own clock. A rank that arrives late (a first step's set-up, a busy
    core) moves every rank's start, so no rank starts before the last one could. Returns the
    start on rank 0's clock (seconds)."""
    box = torch.tensor([time.perf_counter() + offset + margin_s], dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.MAX, group=group)
    start = float(box[0])
    sleep_until(start - offset)
    return start
