"""Mixed precision (``train.dtype``): autocast around every stage forward (and its
recomputation), fp32 master weights and optimizer state, boundary tensors in the compute
dtype, and for fp16 dynamic loss scaling with ``torch.amp.GradScaler``'s semantics agreed
over the world.

The parameters stay fp32 and autocast casts them per op, so the gradients and the optimizer
are fp32. Activations sent forward and gradients sent backward travel in the compute dtype
(half the bytes of fp32); integer boundaries (token ids) stay integer.

fp16 loss scaling: the last stage multiplies its loss by the scale, so every gradient of the
step is scaled; before the optimizer step each rank unscales its own gradients and finds
whether any is inf/nan; one all-reduce (MAX) of that flag over the world makes every rank
skip the step, or take it, together and update the scale identically (halve it on an
overflow; double it after ``growth_interval`` clean steps), as GradScaler does per process.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """Dynamic loss scale with GradScaler's defaults; the found-inf flag is agreed over
    ``group`` (the world by default) so that every rank skips or steps together."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        group=None,
    ):
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.group = group
        self.growth_tracker = 0
        self.skipped = 0  # optimizer steps skipped on an overflow, over the run

    def unscale(self, params) -> bool:
        """Divide every gradient by the scale; True when any local one is inf or nan."""
        # a data-parallel replica's gradients are DTensors (replicate, fully_shard): each rank
        # unscales its own part, in place, and `agree` joins what they found (the op on the
        # DTensors themselves wraps these two tensors as replicated DTensors, warning each step)
        grads = [_local(p.grad) for p in params if p.grad is not None]
        found = torch.zeros(1)
        if grads:
            found = torch.zeros(1, device=grads[0].device)
            inv = torch.full((1,), 1.0 / self.scale, device=grads[0].device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        return bool(found.item())

    def agree(self, found_inf: bool, device) -> bool:
        """Whether any rank of the group found an inf/nan (one small all-reduce)."""
        if not dist.is_initialized():
            return found_inf
        flag = torch.tensor([1.0 if found_inf else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            self.skipped += 1
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale *= self.growth_factor
                self.growth_tracker = 0

    def step(self, opt: torch.optim.Optimizer, device) -> bool:
        """Unscale, agree, step unless any rank overflowed, update the scale; True if stepped."""
        params = [p for group in opt.param_groups for p in group["params"]]
        found = self.agree(self.unscale(params), device)
        if not found:
            opt.step()
        self.update(found)
        return not found


class Precision:
    """One rank's precision: ``name`` is ``train.dtype``, ``device`` the rank's device."""

    def __init__(self, name: str, device, group=None):
        self.name, self.dtype = name, DTYPES[name]
        self.device = torch.device(device)
        self.scaler = LossScaler(group=group) if name == "fp16" else None

    @property
    def mixed(self) -> bool:
        return self.dtype is not torch.float32

    def autocast(self):
        """The context every stage forward (and recomputation) runs in."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def boundary_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a boundary of ``dtype`` travels in: in a mixed dtype, the compute dtype for
        float32 (the stage casts its output: `StageRunner`); else its own (a unit may hand on
        float64, which autocast leaves as it is)."""
        return self.dtype if self.mixed and dtype == torch.float32 else dtype

    def loss_multiplier(self) -> float:
        """What the last stage multiplies its loss by before backward (the fp16 loss scale)."""
        return self.scaler.scale if self.scaler is not None else 1.0


def step_optimizer(pipe, opt: torch.optim.Optimizer, device) -> bool:
    """The optimizer step of ``pipe``'s rank: plain, or under fp16 loss scaling (unscale,
    agree on overflow over the world, step or skip, update the scale). True if it stepped."""
    precision = pipe.precision
    if precision is None or precision.scaler is None:
        opt.step()
        return True
    return precision.scaler.step(opt, device)


def _local(t: torch.Tensor) -> torch.Tensor:
    """``t``'s local tensor where it is a DTensor (a view: in-place changes reach ``t``), else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t
