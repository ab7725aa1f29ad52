"""Users' models whose forward moves buffers (running means read by the output, BatchNorm's
statistics, a counter, a buffer registered at the first call, one shared by two units), for
the tests of ppx/engine/buffers.py and the shared-buffer check."""

from __future__ import annotations

import torch
from torch import nn


class _RunningMean(nn.Module):
    """Normalises by a running mean of its inputs, a buffer its forward moves (a stateful unit)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(0.5 * x.mean(0))
            self.calls = self.calls + 1  # (a new tensor under the name, not an in-place change)
        return self.fc(x - self.mean).tanh()


class _Warming(nn.Module):
    """A running mean registered at its first call and moved from its third on (a warm-up: the
    first forwards leave it as it is)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if not hasattr(self, "mean"):
            self.register_buffer("mean", torch.zeros(x.shape[-1]))
        if self.training:
            if self.calls >= 2:
                with torch.no_grad():
                    self.mean.mul_(0.5).add_(0.5 * x.mean(0))
            self.calls.add_(1)
        return self.fc(x - self.mean).tanh()


class _Cached(nn.Module):
    """A scale registered as None and filled by the first forward (a cache a unit fills once)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.register_buffer("scale", None)

    def forward(self, x):
        if self.scale is None:
            self.scale = x.detach().abs().mean(0)
        return self.fc(x / (1 + self.scale)).tanh()


class _Toggle(nn.Module):
    """A sign flipped in place by each forward and added to the Linear's input: every other
    microbatch finds the value the one before it found."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.register_buffer("sign", torch.ones(()))

    def forward(self, x):
        if self.training:
            self.sign.mul_(-1)
        return self.fc(x + self.sign)


def stateful(model) -> nn.Module:
    """Units whose forward moves buffers: running means (read by the output; one registered at
    its first call and moved from its third), BatchNorm's, and a scale registered as None that
    the first forward fills (each running mean after a Linear: a BatchNorm's output has a batch
    mean of 0)."""
    w = model.hidden
    return nn.Sequential(_RunningMean(w), nn.BatchNorm1d(w), _Cached(w), _RunningMean(w), nn.Linear(w, w), _Warming(w))


class _SharedMean(nn.Module):
    """A Linear after subtracting a running mean it may share with other units (``moves``: this
    unit moves it)."""

    def __init__(self, width: int, mean: torch.Tensor, moves: bool):
        super().__init__()
        self.fc, self.moves = nn.Linear(width, width), moves
        self.register_buffer("mean", mean)

    def forward(self, x):
        if self.moves and self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(0.5 * x.mean(0))
        return self.fc(x - self.mean).tanh()


def shared_buffer(model) -> nn.Module:
    """Units 0 and 3 hold one running mean, which unit 0 moves (``model.args.moves=false``: a
    constant table both read)."""
    w, moves = model.hidden, model.args.get("moves", True)
    mean = torch.zeros(w)
    return nn.Sequential(_SharedMean(w, mean, moves), nn.Linear(w, w), nn.Linear(w, w), _SharedMean(w, mean, False))


def shared_view(model) -> nn.Module:
    """`shared_buffer`, unit 3 holding a view of unit 0's mean (another tensor, one storage)."""
    w = model.hidden
    mean = torch.zeros(w)
    return nn.Sequential(
        _SharedMean(w, mean, True), nn.Linear(w, w), nn.Linear(w, w), _SharedMean(w, mean.view(w), False)
    )


def shared_next_door(model) -> nn.Module:
    """Units 0 and 1 hold one running mean, which unit 0 moves (one stage may hold both)."""
    w = model.hidden
    mean = torch.zeros(w)
    return nn.Sequential(_SharedMean(w, mean, True), _SharedMean(w, mean, False), nn.Linear(w, w), nn.Linear(w, w))
