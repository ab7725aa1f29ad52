"""A stage's buffers that its forward changes (BatchNorm's running statistics, a running mean a
unit normalises by, a step counter): as one process running the microbatches in turn leaves
them, whatever the runtime runs besides.

- A trial forward (`untouched`: the split backward's choice, on a sample microbatch; torch's
  executor's shape inference) runs on copies; it had moved a running mean by one sample
  microbatch more.
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

# each module's buffer entries (a name registered as None too), as a forward found or left them
Entries = list[tuple[nn.Module, dict]]


def _entries(module: nn.Module) -> Entries:
    return [(m, dict(m._buffers)) for m in module.modules()]


@contextlib.contextmanager
def _as(module: nn.Module, entries: Entries):
    """Run the body with each module's buffer entries set to ``entries``' (names registered
    since, absent); after it, the entries are the tensors before, untouched (copied back in
    place, they would fail a graph that saved one: its version moved on)."""
    before = _entries(module)
    for m, bufs in entries:
        m._buffers.clear()
        m._buffers.update(bufs)
    try:
        yield
    finally:
        for m, bufs in before:
            m._buffers.clear()
            m._buffers.update(bufs)


def _copied(entries: Entries, copy) -> Entries:
    """``entries`` with each tensor replaced by ``copy(tensor)``, one copy for a tensor several
    modules hold (a shared buffer stays shared)."""
    made: dict[int, torch.Tensor] = {}
    return [
        (m, {k: None if b is None else made.setdefault(id(b), copy(b)) for k, b in bufs.items()}) for m, bufs in entries
    ]


@contextlib.contextmanager
def untouched(module: nn.Module, device):
    """Run the body as if it never ran: on copies of ``module``'s buffers (after it they are as
    they were; what it registered, removed), and with the CPU's generator and ``device``'s (a
    GPU's) given back."""
    device = torch.device(device)
    gpus = [device.index or 0] if device.type == "cuda" else []
    with _as(module, _copied(_entries(module), lambda b: b.detach().clone())), torch.random.fork_rng(devices=gpus):
        yield


class ForwardBuffers:
    """The buffers each microbatch's forward found (their values, and which there were), until
    that microbatch's recomputation. A buffer's values are copied only where they differ from
    the microbatch before's copy (the buffers no forward moves are kept once), and put back for
    the recomputation where they differ from the buffer's now or a forward moved it in place
    (one that came back to the values it found would be moved once more): a constant table is
    left as it is, and a graph that saves it saves no copy."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.found: dict[int, Entries] = {}
        self._last: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(buffer) -> (buffer, its last copy)
        self._moving: set[int] = set()  # id(buffer) of those a forward moved in place (seen at the next one)

    def _copy(self, b: torch.Tensor) -> torch.Tensor:
        last = self._last.get(id(b))
        if last is not None and last[0] is b and torch.equal(b, last[1]):
            return last[1]
        if last is not None and last[0] is b:
            self._moving.add(id(b))
        copy = b.detach().clone()
        self._last[id(b)] = (b, copy)
        return copy

    @contextlib.contextmanager
    def forward(self, mb: int):
        """Around the forward of ``mb``: keep what it found of the buffers."""
        self.found[mb] = _copied(_entries(self.module), self._copy)
        yield

    @contextlib.contextmanager
    def recompute(self, mb: int):
        """Around the recomputation of ``mb``: the buffers as its forward found them (copies of
        their copies, which it may move), then as they were."""
        found = self.found.pop(mb, None)
        if found is None:  # (a forward that kept nothing)
            yield
            return
        now = dict(_entries(self.module))
        made: dict[int, torch.Tensor] = {}

        def then(m: nn.Module, k: str, copy: torch.Tensor | None):
            b = now[m].get(k)
            if copy is None:
                return None
            if b is not None and id(b) not in self._moving and b.shape == copy.shape and torch.equal(b, copy):
                return b  # (as the forward found it, and no forward moves it in place: left as it is)
            return made.setdefault(id(copy), copy.clone())

        with _as(self.module, [(m, {k: then(m, k, c) for k, c in bufs.items()}) for m, bufs in found]):
            yield
