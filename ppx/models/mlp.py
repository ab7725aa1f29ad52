"""The MLP of the classic pipeline examples: blocks of Linear(hidden, hidden) + GELU,
trained with MSE against targets from a fixed random "teacher" network."""

from __future__ import annotations

import functools

import torch
from torch import nn

from ppx.models.seeding import BLOCK, DATA, TEACHER, generator, seeded


def build_stage(cfg, seed: int, stage: int, num_stages: int, blocks: range, clock=None) -> nn.Module:
    layers = []
    for i in blocks:
        with seeded(seed, BLOCK + i):
            layers += [nn.Linear(cfg.hidden, cfg.hidden), nn.GELU()]
    return nn.Sequential(*layers)


def block_name(cfg, block: int) -> str:
    """The submodule where block ``block`` begins in the whole model (a split point)."""
    return str(2 * block)  # Linear, GELU per block


@functools.lru_cache(maxsize=4)
def _teacher(seed: int, hidden: int) -> torch.Tensor:
    return torch.randn(hidden, hidden, generator=generator(seed, TEACHER)) / hidden**0.5


def make_batch(cfg, seed: int, batch_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x ~ N(0, 1) (batch, hidden) and targets tanh(x @ T) for a fixed teacher T."""
    teacher = _teacher(seed, cfg.hidden)
    x = torch.randn(batch_size, cfg.hidden, generator=generator(seed, DATA + 16 * step))
    return x, torch.tanh(x @ teacher)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def boundary(cfg, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of the activation passed between stages."""
    return (microbatch_size, cfg.hidden), torch.float32
