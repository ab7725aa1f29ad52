"""Activation recomputation of one stage (``train.recompute``), per stage and per microbatch.

- ``full``: the stage's forward runs without a graph; the stage keeps only its input (and,
  on the last stage, the target), and its backward re-runs the forward with the graph first.
- ``selective``: op-level selective activation checkpointing, as torchtitan's: the forward
  runs under torch's `create_selective_checkpoint_contexts` caching mode with a policy that
  saves the outputs of matmuls and scaled-dot-product attention (with grad enabled, as the
  recomputation runs, but saved-tensor hooks that keep nothing of autograd's); the backward
  re-runs the forward under the cached mode, which hands back those outputs and recomputes
  only the cheap element-wise ops (norms, activations, residual adds, casts).

The recomputation runs at the start of the stage's backward, as one explicit forward that
rebuilds the stage's ordinary graph: a B uses it at once; with a split backward the I pass
recomputes and keeps the graph for its W, so the forward is re-run once per microbatch, in I.
(torch.utils.checkpoint recomputes once per autograd call, so W would recompute a second
time, and its `GraphExecGroup` refuses an I and a W that read the same saved tensors.)

What the stage keeps between its forward and backward (the input, the saved op outputs) is
saved by a no-op autograd node (`_Keep`), so the saved-tensor hooks of the memory counters
(`ppx.measure.memory`) see exactly those bytes, as they see autograd's saved tensors when
nothing is recomputed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ppx.engine.buffers import ForwardBuffers

aten = torch.ops.aten


def _ops(*names: str) -> set:
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


# the compute-heavy ops whose outputs selective recomputation keeps (torchtitan's op list)
SAVE_OPS = _ops(
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math",
)


class _Keep(torch.autograd.Function):
    """Saves ``tensors`` for a backward that never runs: the stage's kept state, visible to
    saved-tensor hooks like any activation autograd keeps."""

    @staticmethod
    def forward(ctx, anchor, *tensors):
        ctx.save_for_backward(*tensors)
        return anchor.view_as(anchor)

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - never called
        return (grad,) + (None,) * len(ctx.saved_tensors)


def keep(tensors: list) -> torch.Tensor:
    """A node holding ``tensors`` (saved through the active saved-tensor hooks)."""
    anchor = torch.zeros((), requires_grad=True)
    with torch.enable_grad():
        return _Keep.apply(anchor, *tensors)


class Recompute:
    """Forward and recomputation of one stage under ``mode`` (full or selective).
    ``clock``: the rank's `ActionClock`, told while a forward is re-run (the known-cost model
    charges its forward again under full, and nothing under selective, whose saved matmul
    outputs stand for its modelled cost). ``module``: the stage, whose buffers a forward
    changes (`ppx.engine.buffers.ForwardBuffers`: its recomputation finds them as the forward did)."""

    def __init__(self, mode: str, clock=None, module: nn.Module | None = None):
        if mode not in ("full", "selective"):
            raise ValueError(f"recompute mode {mode!r}")
        self.mode, self.clock = mode, clock
        self.buffers = ForwardBuffers(module) if module is not None else None
        self.pending: dict[int, tuple] = {}  # mb -> (forward, cached mode or None, node keeping what it saved)

    def forward(self, mb: int, run: Callable[[], torch.Tensor], kept: list) -> torch.Tensor:
        """``run()`` without a graph; keeps ``run`` and ``kept`` (input, target) and, under
        selective, the saved op outputs, until `recompute` of ``mb``."""
        kept = [t for t in kept if isinstance(t, torch.Tensor)]
        buffers = self.buffers.forward(mb) if self.buffers is not None else contextlib.nullcontext()
        if self.mode == "full":
            with buffers, torch.no_grad():
                out = run()
            self.pending[mb] = (run, None, keep(kept))
            return out
        saved: list = []

        def policy(ctx, op, *args, **kwargs):
            if saves(op, args, kwargs):
                saved.extend(t.detach() for t in _tensors(getattr(ctx, "op_output", None)))
                return CheckpointPolicy.MUST_SAVE
            if op._schema.is_mutable and _changes_one_of(op, args, kwargs, saved):
                raise RuntimeError(
                    f"train.recompute=selective: {op.overloadpacket.__name__} changes in place an output selective keeps (a "
                    "matmul's: an in-place ReLU after a Linear), which its recomputation would need as it was; "
                    "use train.recompute=full for this stage (one value per stage: train.recompute=[...])"
                )
            return CheckpointPolicy.PREFER_RECOMPUTE

        caching, cached = create_selective_checkpoint_contexts(policy)
        # with grad, as the recomputation runs (an op whose kernel choice depends on it, like
        # SDPA's backend, then dispatches alike both times), but autograd keeps nothing
        with buffers, torch.enable_grad(), saved_tensors_hooks(_drop, _dropped), caching:
            out = run()
        self.pending[mb] = (run, cached, keep(kept + saved))
        return out.detach()

    def recompute(self, mb: int) -> torch.Tensor:
        """Re-run the forward of ``mb`` with its graph (under the cached mode for selective)."""
        run, cached, _ = self.pending.pop(mb)
        clock = self.clock
        if clock is not None:
            clock.recomputing = self.mode
        buffers = self.buffers.recompute(mb) if self.buffers is not None else contextlib.nullcontext()
        try:
            with buffers, torch.enable_grad(), cached if cached is not None else contextlib.nullcontext():
                return run()
        finally:
            if clock is not None:
                clock.recomputing = None


def saves(op, args: tuple, kwargs: dict) -> bool:
    """Whether selective recomputation keeps ``op``'s output: one of `SAVE_OPS`, but not an
    attention with dropout, which re-runs: its kernel draws from the generator (on a GPU, an
    offset it advances), so a kept output would leave the unit's later dropouts other masks
    than its forward drew (`ppx.models.seeding`)."""
    if op not in SAVE_OPS:
        return False
    names = [a.name for a in op._schema.arguments]
    if "dropout_p" not in names:
        return True
    at = names.index("dropout_p")
    p = kwargs.get("dropout_p", args[at] if at < len(args) else 0.0)
    return not p


def _changes_one_of(op, args: tuple, kwargs: dict, kept: list) -> bool:
    """Whether ``op`` writes into the storage of a tensor of ``kept``."""
    # (not empty ones: their address is 0, as is every other empty tensor's)
    storages = {t.untyped_storage().data_ptr() for t in kept if t.untyped_storage().nbytes()}
    written = [
        kwargs[a.name] if a.name in kwargs else args[k] if k < len(args) else None
        for k, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]
    return any(t.untyped_storage().data_ptr() in storages for t in _tensors(written))


def _drop(t: torch.Tensor) -> None:
    return None


def _dropped(_) -> torch.Tensor:
    raise RuntimeError("a recomputing stage's forward graph is never differentiated")


def _tensors(output) -> list:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for o in output for t in _tensors(o)]
    return []
