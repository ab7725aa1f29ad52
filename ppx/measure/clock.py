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


def start_together(offset: float, group=None, margin_s: float = 0.005) -> None:
    """Begin the next step on every rank at the same instant: rank 0 picks a start time
    ``margin_s`` ahead on its clock, and each rank sleeps until then on its own clock.
    Also a barrier: rank 0 reaches it only after every rank has reported its last step."""
    box = torch.zeros(1, dtype=torch.float64)
    if dist.get_rank() == 0:
        box[0] = time.perf_counter() + margin_s
    dist.broadcast(box, src=0, group=group)
    sleep_until(float(box[0]) - offset)
