"""Rank clock alignment: exactly 0 between ranks on one host, measured by round trips between
hosts (stood in for by per-rank clock names and shifted clocks); a common step start that waits
for the last rank to arrive."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from helpers import free_port
from helpers.spawn import spawn
from ppx.measure.clock import offset_to_rank0, start_together

pytestmark = pytest.mark.timing  # clock offsets measured by round trips


def _worker(rank: int, world: int, port: int, out) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        same = offset_to_rank0()
        shifted = lambda: time.perf_counter() + 10.0 * rank  # noqa: E731  rank r's clock runs 10 r s ahead
        measured = offset_to_rank0(clock_id=f"host{rank}", now=shifted)
        torch.save((same, measured), f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_offset_is_zero_on_one_host_and_measured_across_hosts(tmp_path):
    world = 3
    spawn(_worker, (world, free_port(), str(tmp_path)), world)
    for rank in range(world):
        same, measured = torch.load(tmp_path / f"{rank}.pt")
        assert same == 0.0
        # within half a round trip of gloo on a loaded machine; a broken offset is 10 s off
        assert abs(measured - (-10.0 * rank)) < 0.1, (rank, measured)


LATE_S = 0.05  # rank 1 arrives this late at every start (a first step's set-up on one rank)
MARGIN_S = 0.005


def _start_worker(rank: int, world: int, port: int, out) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        rows = []
        for _ in range(3):
            dist.barrier()
            if rank == 1:
                time.sleep(LATE_S)
            arrived = time.perf_counter()
            start = start_together(0.0, margin_s=MARGIN_S)
            rows.append((arrived, start, time.perf_counter()))
        torch.save(rows, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_start_together_waits_for_the_last_rank(tmp_path):
    """Every rank starts at one instant, the margin after the latest arrival: a start picked at
    rank 0's arrival would have passed 50 ms before rank 1 got there, and the ranks would then
    start whenever each learnt of it."""
    world = 2  # a rank per core: more would wait their turn for a core, not for the start
    spawn(_start_worker, (world, free_port(), str(tmp_path)), world)
    rows = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]  # one host: one clock
    for i in range(3):
        arrived, start, woke = zip(*(rows[r][i] for r in range(world)))
        assert len(set(start)) == 1  # one start, every rank's
        assert start[0] >= max(arrived) + MARGIN_S  # no rank starts before the last could
        assert min(woke) >= start[0]
        assert max(woke) - start[0] < LATE_S / 5, woke  # together: not a late arrival apart
