"""One pipeline stage on its rank: runs forward and backward per microbatch and keeps what
backward needs between the two."""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch
from torch import nn

_action_started = 0.0


def action_started() -> float:
    """``time.perf_counter()`` when the current forward/backward action began (the
    known-cost model counts its cost from here, so framework overhead is inside it)."""
    return _action_started


class StageRunner:
    """Forward/backward of stage ``index`` for one microbatch at a time.

    The first stage reads data, the others a received activation (made a leaf that requires
    grad, so backward yields the gradient to send back). The last stage computes the loss,
    scaled by ``loss_scale`` (1/microbatches) so the summed microbatch gradients equal the
    full-batch gradient.
    """

    def __init__(self, index: int, module: nn.Module, first: bool, last: bool,
                 loss_fn: Callable, loss_scale: float, training: bool):
        self.index, self.module = index, module
        self.first, self.last = first, last
        self.loss_fn, self.loss_scale, self.training = loss_fn, loss_scale, training
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, mb: int, x: torch.Tensor, target: Optional[torch.Tensor]) -> torch.Tensor:
        """Return the activation for the next stage, or (last stage) the scaled loss, detached."""
        global _action_started
        _action_started = time.perf_counter()
        if self.training and not self.first:
            x.requires_grad_(True)
        with torch.set_grad_enabled(self.training):
            out = self.module(x)
            if self.last:
                out = self.loss_fn(out, target) * self.loss_scale
        if self.training:
            self.saved[mb] = (x, out)
        return out.detach() if self.last else out

    def backward(self, mb: int, grad_output: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Accumulate parameter gradients; return d(loss)/d(input) for the previous stage."""
        global _action_started
        _action_started = time.perf_counter()
        x, out = self.saved.pop(mb)
        torch.autograd.backward(out, grad_output)
        return None if self.first else x.grad

    def in_flight(self) -> int:
        """Microbatches whose activations are held for a backward still to come."""
        return len(self.saved)
