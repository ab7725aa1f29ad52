"""Two pieces of mixed precision the built-in models share, so that a bf16 (fp16) run keeps
its activations in the compute dtype, as bf16 training with bf16 parameters does:

- `to_compute_dtype`: the embedding's output cast to autocast's dtype (an embedding is not an
  autocast op, so it would start the residual stream in fp32 on the first stage, while every
  later stage receives it in the compute dtype: the same model would then compute differently
  with the split). The residual stream is in the compute dtype everywhere, whatever the split.
- `lean_rms_norm`: RMSNorm computed in fp32 (as Meta's Llama does) whose backward keeps the
  input in its own dtype and the fp32 reciprocal RMS per token, as fused RMSNorm kernels do,
  instead of autograd's fp32 copies of the input and the normalised input. The forward's values
  are F.rms_norm's; in fp32 it is F.rms_norm itself (autograd's graph, bit for bit as before)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def to_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in autocast's dtype where autocast is on (a floating ``x``), else ``x``."""
    kind = x.device.type
    if x.is_floating_point() and torch.is_autocast_enabled(kind):
        return x.to(torch.get_autocast_dtype(kind))
    return x


class _LeanRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        xw = x.float()
        rstd = torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return F.rms_norm(xw, (x.shape[-1],), weight.float(), eps).to(x.dtype)

    @staticmethod
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
