"""Rank clock alignment: exactly 0 between ranks on one host, measured by round trips between
hosts (stood in for by per-rank clock names and shifted clocks)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from helpers import free_port
from helpers.spawn import spawn
from ppx.measure.clock import offset_to_rank0

pytestmark = pytest.mark.timing  # clock offsets measured by round trips


def _worker(rank: int, world: int, port: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
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
