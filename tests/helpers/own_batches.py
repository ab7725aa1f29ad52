"""Users' batch functions of every shape a batch may come in, wrong or right (a shrinking
batch, another sample count, targets in a tuple or flattened, a global generator's draws),
for the batch checks (ppx/engine/step_batch.py, ppx/models/module_chain.py)."""

from __future__ import annotations

import torch

from helpers.own_module import batch


def batch_shrinking(model, seed: int, batch_size: int, step: int):
    """`batch`, with half the samples from step 1 on (a last, short batch of a dataset)."""
    return batch(model, seed, batch_size if step == 0 else batch_size // 2, step)


def batch_of_ten(model, seed: int, batch_size: int, step: int):
    """`batch` of 10 samples, whatever it is asked."""
    return batch(model, seed, 10, step)


def batch_capped(model, seed: int, batch_size: int, step: int):
    """`batch` of at most 8 samples: right for a microbatch, short for the whole batch."""
    return batch(model, seed, min(batch_size, 8), step)


def batch_tuple_targets(model, seed: int, batch_size: int, step: int):
    """`batch` with its targets in a tuple (ppx splits one tensor)."""
    x, y = batch(model, seed, batch_size, step)
    return x, (y,)


def batch_flat_targets(model, seed: int, batch_size: int, step: int):
    """`batch` with its targets flattened, one row per feature (a target per token's way)."""
    x, y = batch(model, seed, batch_size, step)
    return x, y.reshape(-1)


def loss_flat(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output.reshape(-1) - target).abs().mean()


def batch_from_torch(model, seed: int, batch_size: int, step: int):
    """`batch`'s shapes, drawn from torch's global generator (no generator of its own)."""
    x = torch.randn(batch_size, model.args.get("width", 16))
    return x, x.flip(-1).sin()
