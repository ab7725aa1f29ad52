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


def test_counting_saved_bytes_keeps_nothing_alive_after_the_graph_goes():
    """A node that saves its own output (exp's) on a path no backward runs (train.split_backward=graph:
    its W takes the weights' gradients only, and the input's I kept the graph): once the graph is
    dropped, nothing the forward saved stays alive, as without the counter's hooks (whose packed
    tensor, holding its node, made a cycle autograd's C++ graph never frees: a run's memory grew
    by every counted microbatch)."""
    import gc
    import weakref

    layer = torch.nn.Linear(8, 8)
    tracker = MemoryTracker({0: layer}, True, lambda: 1, torch.device("cpu"))
    with tracker._hooks:
        x = torch.randn(4, 8, requires_grad=True)
        y = torch.exp(x)  # saves its output
        out = layer(y).sum()
    alive = weakref.ref(y)
    torch.autograd.grad(out, [x], retain_graph=True)  # I: the input's gradient, the graph kept
    torch.autograd.grad(out, list(layer.parameters()))  # W: the weights', exp's node never runs
    del x, y, out
    gc.collect()
    assert alive() is None, "the counted forward's saved output outlived its graph"
