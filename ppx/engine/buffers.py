"""A stage's buffers that its forward changes (BatchNorm's running statistics, a running mean a
unit normalises by, a step counter): as one process running the microbatches in turn leaves
them, whatever the runtime runs besides.

- A trial forward (`untouched`: the split backward's choice, on a sample microbatch) runs on
  copies; it had moved a running mean by one sample microbatch more.
- A recomputed forward (`ForwardBuffers`, under ``train.recompute``) runs on copies of the
  values its forward found; it had run on values later microbatches had moved on, and moved
  them twice (torch.utils.checkpoint does both).

A buffer is told changed by its values (BatchNorm's kernel moves its statistics without
bumping their version counters) or by a new tensor under its name (``self.count = self.count + 1``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def _values(module: nn.Module, names=None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each buffer (of ``names``; None: all) by name: (the tensor, a copy of its values)."""
    named = module.named_buffers() if names is None else ((n, module.get_buffer(n)) for n in names)
    return {n: (b, b.detach().clone()) for n, b in named}


def _changed(module: nn.Module, before: dict) -> list[str]:
    """The buffers of ``before`` (`_values`) now another tensor or holding other values."""
    now = dict(module.named_buffers())
    return [n for n, (b, v) in before.items() if now.get(n) is not b or not torch.equal(b, v)]


@contextlib.contextmanager
def _swapped(module: nn.Module, values: dict[str, torch.Tensor]):
    """Run the body with each buffer of ``values`` (by name, wherever the model holds that
    tensor) replaced by its tensor there; the buffers after are the tensors before, untouched
    (copied back in place, they would fail a graph that saved one: its version moved on)."""
    tensors = {id(module.get_buffer(n)): v for n, v in values.items()}
    held = [
        (owner, key, b)
        for owner in module.modules()
        for key, b in owner._buffers.items()
        if b is not None and id(b) in tensors
    ]
    for owner, key, b in held:
        owner._buffers[key] = tensors[id(b)]
    try:
        yield
    finally:
        for owner, key, b in held:
            owner._buffers[key] = b


@contextlib.contextmanager
def untouched(module: nn.Module):
    """Run the body on copies of ``module``'s buffers: they keep the values they had."""
    with _swapped(module, {n: b.detach().clone() for n, b in module.named_buffers()}):
        yield


class ForwardBuffers:
    """The values each microbatch's forward found, of the buffers the stage's forward changes
    (those its first forward changed: a buffer changed only from a later microbatch on is not
    told), until that microbatch's recomputation."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.changing: list[str] | None = None  # None: not known yet (every buffer is kept once)
        self.found: dict[int, dict[str, torch.Tensor]] = {}

    @contextlib.contextmanager
    def forward(self, mb: int):
        """Around the forward of ``mb``: keep what it found of the buffers it changes."""
        before = _values(self.module, self.changing)
        yield
        if self.changing is None:
            self.changing = _changed(self.module, before)
        if self.changing:
            self.found[mb] = {n: before[n][1] for n in self.changing}

    @contextlib.contextmanager
    def recompute(self, mb: int):
        """Around the recomputation of ``mb``: the buffers as its forward found them, then as they were."""
        with _swapped(self.module, self.found.pop(mb, {})):
            yield
