"""Your own models whose units hand on tensors of different shapes and dtypes, for
model.kind=module tests: an MLP of changing widths, a small CNN whose feature maps narrow,
and units that hand on integers (bins, then their embedding) inside a stage."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

WIDTHS = (16, 32, 8, 24, 16)  # an MLP's widths: its 4 units hand on (b, 32), (b, 8), (b, 24)


def widths(model) -> nn.Module:
    """Linear + Tanh units from one width to the next (``model.args.widths``, else `WIDTHS`);
    its data: ppx's regression at model.hidden=16, the first width (and the last)."""
    w = list(model.args.get("widths", WIDTHS))
    layers = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(w[:-2], w[1:-1])]
    return nn.Sequential(*layers, nn.Linear(w[-2], w[-1]))


def convnet(model) -> nn.Module:
    """A CNN on 3 x 8 x 8 images, 4 units: a stem (8 maps of 8 x 8), two strided convolutions
    (16 of 4 x 4, then 16 of 2 x 2), and a head of 10 classes."""
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU()),
        nn.Sequential(nn.Flatten(), nn.Linear(16 * 2 * 2, 10)),
    )


def images(model, seed: int, batch_size: int, step: int):
    """3 x 8 x 8 images and a class (of 10) each, from the seed and step only."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(batch_size, 3, 8, 8, generator=g)
    return x, torch.randint(0, 10, (batch_size,), generator=g)


def classes(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target)


class _Bins(nn.Module):
    """Each feature to one of 16 bins: integers, which no gradient flows through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 4).round().clamp(-8, 7).long() + 8


class _Pool(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(8, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h.mean(-2))


def quantized(model) -> nn.Module:
    """Units [bins, embed, mix, pool]: bins hands on int64 (b, 16), which embed (16 bins, 8
    wide) takes; a stage may begin at mix or pool, not at embed. Data: ppx's regression at
    model.hidden=16."""
    return nn.Sequential(_Bins(), nn.Embedding(16, 8), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), _Pool(16))


class _Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


class _DoubleMatmul(nn.Module):
    """A float64 weight multiplied by the unit's own ``@``: autocast leaves float64 as it is."""

    def __init__(self, width: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width, dtype=torch.float64) / width**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w)


def double_matmul(model) -> nn.Module:
    """Units [Linear, to float64, a float64 matmul]: under bf16 a stage beginning at the
    matmul receives float64 (cast to bf16, its ``@`` failed on two dtypes)."""
    return nn.Sequential(nn.Linear(16, 16), _Double(), _DoubleMatmul(16))
