"""Peak memory per step (ppx.measure.memory)."""

from __future__ import annotations

import pytest
import torch

from ppx.measure.memory import MemoryTracker


def _peak_resets() -> bool:
    from pathlib import Path

    return Path("/proc/self/clear_refs").exists() and Path("/proc/self/status").exists()


@pytest.mark.skipif(not _peak_resets(), reason="needs Linux's /proc/self/clear_refs to reset the peak resident set")
def test_cpu_peak_memory_is_the_steps_own():
    """The peak resident set starts afresh each step: a step that touches 256 MiB shows it,
    the next one, which does not, shows a peak at least 200 MiB lower."""
    tracker = MemoryTracker({}, True, lambda: 0, torch.device("cpu"))
    tracker.begin_step(0)
    big = torch.ones(2**26)  # 256 MiB, written
    del big
    first = tracker.end_step(0)["peak_memory_bytes"]
    tracker.begin_step(1)
    second = tracker.end_step(1)["peak_memory_bytes"]
    assert first - second > 200 * 2**20, (first, second)


def test_param_bytes_are_the_ranks_parameters():
    """Each step's record holds the bytes of the rank's parameters, every stage's, counted once
    per parameter (a memory model adds them for weights, gradients and optimizer state)."""
    stages = {0: torch.nn.Linear(10, 5), 3: torch.nn.Linear(5, 2, bias=False)}
    tracker = MemoryTracker(stages, True, lambda: 0, torch.device("cpu"))
    tracker.begin_step(0)
    assert tracker.end_step(0)["param_bytes"] == ((10 * 5 + 5) + 5 * 2) * 4
