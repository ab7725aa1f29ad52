"""The pieces of mixed precision the built-in models share, so that a bf16 (fp16) run keeps
its activations in the compute dtype, as bf16 training with bf16 parameters does:

- `to_compute_dtype`: the embedding's output cast to autocast's dtype (an embedding is not an
  autocast op, so it would start the residual stream in fp32 on the first stage, while every
  later stage receives it in the compute dtype: the same model would then compute differently
  with the split). The residual stream is in the compute dtype everywhere, whatever the split.
- `lean_rms_norm`: RMSNorm computed in fp32 (as Meta's Llama does) whose backward keeps the
  input in its own dtype and the fp32 reciprocal RMS per token, as fused RMSNorm kernels do,
  instead of autograd's fp32 copies of the input and the normalised input. The forward's values
  are F.rms_norm's; in fp32 it is F.rms_norm itself (autograd's graph, bit for bit as before).
- `lean_layer_norm`: the same for LayerNorm (input in its own dtype, fp32 mean and reciprocal
  standard deviation per token), and like CUDA's autocast it returns fp32: the values are its
  to the bit, whatever takes them next. CUDA's autocast runs layer_norm in fp32, so its graph
  keeps an fp32 copy of every norm's input: twice a bf16 activation's bytes.
- `lean_cross_entropy`: the loss in fp32 (autocast runs it so on CUDA and CPU) whose backward
  keeps the logits in their own dtype and the fp32 log-sum-exp per token, as fused
  cross-entropy kernels do, instead of the fp32 log-softmax of every logit. Its values are
  F.cross_entropy's on the fp32 logits to rounding (mean over every token: no ignored index,
  which ppx's token data never has); in fp32 it is F.cross_entropy itself.

The lean ops' backwards are not differentiable again (``once_differentiable``: a second backward
fails)."""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

NARROW = (torch.bfloat16, torch.float16)  # the compute dtypes the lean ops keep inputs in


def to_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in autocast's dtype where autocast is on (a floating ``x``), else ``x``. While
    torch's tracer runs the model (`tracing`: autocast is off there) it leaves a node that
    decides when the graph runs, so a traced split casts where the layer split does."""
    if not x.is_floating_point():
        return x
    if _TRACING[0]:
        return _traced_cast()(x)
    dtype = _autocast_dtype(x.device.type)
    return x if dtype is None else x.to(dtype)


def _autocast_dtype(kind: str) -> torch.dtype | None:
    """Autocast's dtype on device type ``kind`` where it is on, else None (on the meta device,
    where the checks run the model, there is no autocast to ask)."""
    return torch.get_autocast_dtype(kind) if kind != "meta" and torch.is_autocast_enabled(kind) else None


_TRACING = [False]


@contextlib.contextmanager
def tracing(on: bool = True):
    """While torch's tracer runs a model of a mixed-precision run (``on``;
    `ppx.engine.rank.traced_stage_modules`)."""
    before, _TRACING[0] = _TRACING[0], on
    try:
        yield
    finally:
        _TRACING[0] = before


@functools.cache
def _traced_cast():
    """`to_compute_dtype` as one op of a traced graph (``ppx::to_compute_dtype``): autocast's
    dtype where it is on when the graph runs, else a copy (an op returns no alias of its
    input). Registered on first use, by the first trace (a run that traces nothing never
    registers it), its types given as objects, not this module's postponed strings (which
    torch 2.4's `custom_op` cannot read)."""

    def cast(x):
        return x.to(_autocast_dtype(x.device.type) or x.dtype, copy=True)

    cast.__annotations__ = {"x": torch.Tensor, "return": torch.Tensor}
    op = torch.library.custom_op("ppx::to_compute_dtype", cast, mutates_args=())
    op.register_fake(lambda x: torch.empty_like(x))  # (traced without autocast: the input's dtype)
    op.register_autograd(_cast_back, setup_context=_cast_setup)  # (differentiable again: a plain cast)
    return op


def _cast_back(ctx, grad: torch.Tensor):
    return grad.to(ctx.dtype)


def _cast_setup(ctx, inputs, output) -> None:
    ctx.dtype = inputs[0].dtype


class _LeanRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        xw = x.float()
        rstd = torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return F.rms_norm(xw, (x.shape[-1],), weight.float(), eps).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float()
        gw = (g * xhat).reshape(-1, x.shape[-1]).sum(0)
        gxhat = g * weight.float()
        gx = rstd * (gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw.to(weight.dtype), None


def lean_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) x weight in fp32 (at least), returned in ``x``'s dtype."""
    wide = torch.promote_types(x.dtype, torch.float32)
    if x.dtype == wide:
        return F.rms_norm(x, (x.shape[-1],), weight.to(wide), eps)
    with torch.autocast(x.device.type, enabled=False):
        return _LeanRMSNorm.apply(x, weight, eps)


class _LeanLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps):
        wide = [None if t is None else t.float() for t in (weight, bias)]
        out, mean, rstd = torch.native_layer_norm(x.float(), shape, *wide, eps)
        ctx.shape = shape
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        wide = [None if t is None else t.float() for t in (weight, bias)]
        mask = [
            ctx.needs_input_grad[0],
            weight is not None and ctx.needs_input_grad[2],
            bias is not None and ctx.needs_input_grad[3],
        ]
        gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
            grad.float(), x.float(), ctx.shape, mean, rstd, *wide, mask
        )
        return (
            None if gx is None else gx.to(x.dtype),
            None,
            None if gw is None else gw.to(weight.dtype),
            None if gb is None else gb.to(bias.dtype),
            None,
        )


def lean_layer_norm(
    x: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dimensions (``shape``) in fp32 (at least), returned in fp32 for a
    bf16 (fp16) ``x``. (No autocast inside: its ops take fp32 only, which autocast leaves as they
    are.)"""
    if x.dtype in NARROW:
        return _LeanLayerNorm.apply(x, tuple(shape), weight, bias, eps)
    return F.layer_norm(x, shape, weight, bias, eps)


class LeanLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (the same parameters) whose backward keeps a bf16 (fp16) input in its
    own dtype: `lean_layer_norm` (fp32 out, as CUDA's autocast gives it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lean_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class _LeanCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        wide = logits.float()
        lse = torch.logsumexp(wide, dim=-1)
        ctx.save_for_backward(logits, target, lse)
        return (lse - wide.gather(-1, target.unsqueeze(-1)).squeeze(-1)).mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        logits, target, lse = ctx.saved_tensors
        probs = logits.float().sub_(lse.unsqueeze(-1)).exp_()  # softmax, in place: one fp32 temporary
        probs.scatter_add_(-1, target.unsqueeze(-1), torch.full_like(lse, -1.0).unsqueeze(-1))
        return probs.mul_(grad / logits.shape[0]).to(logits.dtype), None


def lean_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of ``logits`` (tokens, classes) against ``target`` (tokens), in
    fp32 (at least)."""
    if logits.dtype in NARROW:
        return _LeanCrossEntropy.apply(logits, target)
    return F.cross_entropy(logits, target)
