"""A Hugging Face model's norms in a mixed dtype, kept as lean as ppx's own models' are
(`ppx.models.precision_ops`): the same values and gradients, fewer saved bytes.

- Llama's RMSNorm (and every copy of it: Qwen2's, Mistral's; found by its forward's code, op
  for op the same as transformers' ``LlamaRMSNorm.forward``) computes in fp32 from a bf16
  input, so autograd's graph keeps an fp32 copy of the input and the bf16 normalised input:
  6 bytes an element where fp32 keeps 8. `_LeanHFRMSNorm` computes the same ops and keeps the
  bf16 input and the fp32 reciprocal RMS per token, and its backward is autograd's formulas
  for them, so the gradients are bit for bit the module's own (tests/unit/test_precision_ops.py).
- torch's ``nn.LayerNorm`` (GPT-2's) becomes ppx's `LeanLayerNorm`.

In fp32 (or with a weight that is not fp32) each runs the module's own forward."""

from __future__ import annotations

import types

import torch
from torch import nn

from ppx.models.precision_ops import LeanLayerNorm


class _LeanHFRMSNorm(torch.autograd.Function):
    """weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype), x32 = x in fp32: the forward's
    ops in transformers' order; the backward autograd's formula for each, in reverse."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x32 = x.to(torch.float32)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        x32 = x.to(torch.float32)
        h = (x32 * rstd).to(x.dtype)
        gw = (grad * h).sum(dim=tuple(range(grad.dim() - 1)))  # mul's, summed to the weight's shape
        gh = (grad * weight).to(x.dtype).to(torch.float32)  # to h's dtype, then back through the cast
        g_rstd = (gh * x32).sum(-1, keepdim=True)
        g_var = -0.5 * g_rstd * rstd.pow(3)  # rsqrt's
        g_sq = g_var.expand_as(x32) / x32.shape[-1]  # mean's
        gx = gh * rstd + g_sq * (2.0 * x32)  # mul's and pow's, summed
        return gx.to(x.dtype), gw, None


def _reference_forward():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm.forward


def _same_code(a, b) -> bool:
    a, b = a.__code__, b.__code__
    return (a.co_code, a.co_consts, a.co_names, a.co_varnames) == (b.co_code, b.co_consts, b.co_names, b.co_varnames)


def _lean_rms_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The instance's forward (bound to it, so a deep copy binds to the copy)."""
    w = self.weight
    if x.dtype == torch.float32 or w.dtype != torch.float32 or not x.is_floating_point():
        return type(self).forward(self, x)
    with torch.autocast(x.device.type, enabled=False):
        return _LeanHFRMSNorm.apply(x, w, self.variance_epsilon)


def lean_norms(stage: nn.Module) -> int:
    """Make ``stage``'s norms lean in a mixed dtype (above); how many it changed."""
    reference, changed = _reference_forward(), 0
    for module in stage.modules():
        cls = type(module)
        if cls is nn.LayerNorm:
            module.__class__ = LeanLayerNorm
        elif "forward" in cls.__dict__ and _same_code(cls.forward, reference) and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_lean_rms_forward, module)
        else:
            continue
        changed += 1
    return changed
