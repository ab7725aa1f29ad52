"""A stage whose input gets no gradient (a unit whose own forward runs under torch.no_grad()
beginning it): its backward, whole or split (I), says so in one line with the way out, where
the runtime failed sending None ("'NoneType' object has no attribute 'contiguous'"); and a
stage whose module changes its input in place is handed a copy (`StageRunner.copies_input`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.own_module import _NoGradLinear
from ppx.engine.stage import StageRunner


def runner(module: nn.Module, split: bool) -> StageRunner:
    """Stage 1 of 3 (neither first nor last), training."""
    return StageRunner(1, module, False, False, None, 1.0, True, split=split)


@pytest.mark.parametrize("split", [False, True])
def test_no_gradient_to_a_stage_input_is_one_line(split):
    stage = runner(nn.Sequential(_NoGradLinear(4, 4), nn.Linear(4, 4)), split)
    out = stage.forward(0, torch.randn(2, 4), None)
    with pytest.raises(RuntimeError, match=r"^no gradient reaches stage 1's input \(a unit that runs under torch"):
        (stage.backward_input if split else stage.backward)(0, torch.ones_like(out))


def test_a_stage_that_changes_its_input_in_place_is_handed_a_copy():
    """The received input stays as it came (a leaf autograd lets be) and gets its gradient."""
    stage = runner(nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 4)), False)
    x = torch.randn(2, 4)
    out = stage.forward(0, x.clone(), None)
    grad = stage.backward(0, torch.ones_like(out))
    assert stage.copies_input is True
    want = (torch.ones(2, 4) @ stage.module[1].weight) * (x > 0)
    torch.testing.assert_close(grad, want)
    plain = runner(nn.Sequential(nn.Linear(4, 4)), False)
    plain.forward(0, x, None)
    assert plain.copies_input is False  # (learned at the first forward: no copy from then on)
