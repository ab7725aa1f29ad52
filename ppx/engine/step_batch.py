"""A step's whole batch, from the model kind's data (``model.batch_fn``, or ppx's): what the
pipeline is built for, checked every step. The stages' buffers, the shapes sent between them and
the microbatch split are set from the first step's batch, so a batch of another sample count
(split into microbatches of other sizes) or whose shapes change from step to step (a sequence
length drawn per batch) is refused in one line, on the rank that made it; it had ended the job
in gloo's abort, or been computed on a partly stale buffer."""

from __future__ import annotations

import torch

from ppx.errors import UserError
from ppx.models.module_chain import batch_problem


def _shapes(t) -> str:
    return (
        f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" if isinstance(t, torch.Tensor) else type(t).__name__
    )


class StepBatches:
    """``kind.make_batch`` of each step, with ``cfg.train``'s seed and global batch size, on
    process rank ``rank`` (named in the line of a batch that changed)."""

    def __init__(self, cfg, kind, rank: int):
        self.cfg, self.kind, self.rank = cfg, kind, rank
        self.first: tuple[int, tuple[str, str]] | None = None  # (its step, (inputs, targets) shapes)

    def __call__(self, step: int) -> tuple:
        cfg, t = self.cfg, self.cfg.train
        x, y = self.kind.make_batch(cfg.model, t.seed, t.batch_size, step)
        where = f"model.batch_fn={cfg.model.batch_fn}" if getattr(cfg.model, "batch_fn", None) else "the batch"
        shapes = (_shapes(x), _shapes(y))
        if self.first is None:
            wrong = batch_problem(x, y, t.batch_size)
            if wrong:
                raise UserError(f"{where}: step {step}: {wrong}")
            self.first = (step, shapes)
        elif shapes != self.first[1]:
            first, was = self.first
            raise UserError(
                f"{where} on rank {self.rank}: step {step}'s inputs and targets are {shapes[0]} and {shapes[1]}, "
                f"where step {first}'s were {was[0]} and {was[1]}; ppx builds its stages for the first step's batch "
                "(the microbatches, what they send): keep a batch's shapes and dtypes fixed (pad to one length)"
            )
        return x, y
