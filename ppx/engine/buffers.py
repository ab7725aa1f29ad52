"""A stage's buffers that its forward changes (BatchNorm's running statistics, a running mean a
unit normalises by, a step counter): as one process running the microbatches in turn leaves
them, whatever the runtime runs besides.

- A trial forward (`untouched`: the split backward's choice, on a sample microbatch) runs on
  copies; it had moved a running mean by one sample microbatch more.
- A recomputed forward (`ForwardBuffers`, under ``train.recompute``) runs on copies of the
  values its forward found; it had run on values later microbatches had moved on, and moved
  them twice (torch.utils.checkpoint does both).

A buffer is told changed by its values (BatchNorm's kernel moves its statistics without
bumping their version counters), by a new tensor under its name (``self.count = self.count +
1``), or by being registered in the forward. State outside buffers (a plain tensor attribute, a
Python number) is not seen, and moves again: keep what a forward moves in registered buffers.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

_ABSENT = object()  # (a buffer name not held by its module)


@contextlib.contextmanager
def _swapped(module: nn.Module, values: dict[str, torch.Tensor | None]):
    """Run the body with each buffer of ``values`` (by name, wherever the model holds that
    tensor) replaced by its tensor there, or absent (None); after it, the buffers are the
    tensors before, untouched (copied back in place, they would fail a graph that saved one:
    its version moved on)."""
    held = []
    for name, value in values.items():
        path, _, key = name.rpartition(".")
        owner = module.get_submodule(path)
        now = owner._buffers.get(key)
        places = (
            [(owner, key)]
            if now is None
            else [(m, k) for m in module.modules() for k, b in m._buffers.items() if b is now]
        )
        for m, k in places:
            held.append((m, k, m._buffers.get(k, _ABSENT)))
            if value is None:
                m._buffers.pop(k, None)
            else:
                m._buffers[k] = value
    try:
        yield
    finally:
        for m, k, b in reversed(held):
            if b is _ABSENT:
                m._buffers.pop(k, None)
            else:
                m._buffers[k] = b


@contextlib.contextmanager
def untouched(module: nn.Module):
    """Run the body on copies of ``module``'s buffers: they keep the values they had, and a
    buffer the body registers is removed after it (the first real forward registers it)."""
    names = {n for n, _ in module.named_buffers()}
    try:
        with _swapped(module, {n: b.detach().clone() for n, b in module.named_buffers()}):
            yield
    finally:
        for n in [n for n, _ in module.named_buffers() if n not in names]:
            path, _, key = n.rpartition(".")
            module.get_submodule(path)._buffers.pop(key, None)


class ForwardBuffers:
    """The buffers each microbatch's forward found (their values, and which there were), until
    that microbatch's recomputation. A buffer's values are copied only when they differ from the
    microbatch before's copy: the buffers no forward moves are kept once."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.found: dict[int, dict[str, torch.Tensor]] = {}
        self._last: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (the buffer, its last copy)

    @contextlib.contextmanager
    def forward(self, mb: int):
        """Around the forward of ``mb``: keep what it found of the buffers."""
        now = dict(self.module.named_buffers())
        found = {}
        for name, b in now.items():
            last = self._last.get(name)
            same = last is not None and last[0] is b and torch.equal(b, last[1])
            found[name] = last[1] if same else b.detach().clone()
        self._last = {name: (now[name], found[name]) for name in now}
        self.found[mb] = found
        yield

    @contextlib.contextmanager
    def recompute(self, mb: int):
        """Around the recomputation of ``mb``: the buffers as its forward found them (copies
        of their copies, which it may move; those registered since, absent), then as they were."""
        found = self.found.pop(mb, None)
        if found is None:  # (a forward that kept nothing)
            yield
            return
        values: dict[str, torch.Tensor | None] = {n: v.clone() for n, v in found.items()}
        values |= {n: None for n, _ in self.module.named_buffers() if n not in found}
        with _swapped(self.module, values):
            yield
