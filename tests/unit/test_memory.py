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


def test_what_a_backward_frees_before_its_release_leaves_the_count_at_once():
    """torch's I detaches its stage's outputs, freeing what only they kept (a loss's logits)
    before the W that releases the microbatch in the accounting: the counters drop those bytes
    at the I (they held them to the W, and the next forward's tensors at the freed addresses
    counted as shared: the saved bytes and the peak moved from run to run)."""
    from ppx.schedules.comms.program import Item
    from ppx.schedules.ir.action import Action, Op

    def item(op):
        return Item("compute", (Action(0, op, 0),), f"0{op.value}0")

    layer = torch.nn.Linear(8, 8)
    tracker = MemoryTracker({0: layer}, True, lambda: 1, torch.device("cpu"))
    tracker.begin_step(0)
    x = torch.randn(4, 8, requires_grad=True)
    tracker.before(item(Op.F))
    h = layer(x)  # saves x
    out = torch.exp(h)  # saves its output, which only its node keeps once `out` goes
    tracker.after(item(Op.F))
    saved = tracker.per_microbatch[0]
    assert saved == 2 * 4 * 8 * 4 and tracker.live_bytes == saved
    torch.autograd.grad(h, [x], torch.ones_like(h), retain_graph=True)  # the input's gradient
    del out  # the output side let go: exp's node and its saved output freed
    tracker.before(item(Op.I))
    tracker.after(item(Op.I))
    assert tracker.after_input[0] == saved - 4 * 8 * 4 and tracker.live_bytes == saved - 4 * 8 * 4
    tracker.after(item(Op.W))
    assert tracker.live_bytes == 0 and tracker.peak_bytes == saved
    # a storage something else still keeps (torch's kept outputs, the caller's batch) stays counted
    tracker.begin_step(1)
    tracker.before(item(Op.F))
    out = torch.exp(layer(x))
    tracker.after(item(Op.F))
    alias = out.detach()[0]  # keeps exp's output storage alive
    del out
    tracker.before(item(Op.I))
    tracker.after(item(Op.I))
    assert tracker.after_input[0] == saved and alias.numel() == 8
