"""A Hugging Face model's norms in a mixed dtype, kept as lean as ppx's own models' are
(`ppx.models.precision_ops`): fewer saved bytes, the same values.

- Llama's RMSNorm (and every copy of it: Qwen2's, Mistral's) computes in fp32 from a bf16
  input, so autograd's graph keeps an fp32 copy of the input and the bf16 normalised input:
  6 bytes an element where fp32 keeps 8. `_LeanHFRMSNorm` computes the same ops and keeps the
  bf16 input and the fp32 reciprocal RMS per token, and its backward is autograd's formulas
  for them, so the values and gradients are bit for bit the module's own
  (tests/unit/test_precision_ops.py). A norm is taken when its class's forward is, in
  bytecode, `LLAMA_RMS_NORM_FORWARD` below (transformers' own, as of 5.24): a later
  transformers that computes it otherwise is left alone, never given this formula.
- torch's ``nn.LayerNorm`` (GPT-2's) becomes ppx's `LeanLayerNorm`: CUDA's autocast's values
  to the bit (fp32 out), its weight gradients in fp32 where CPU's bf16 kernel rounds.

In fp32 each runs the module's own forward."""

from __future__ import annotations

import dis
import types

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ppx.models.precision_ops import NARROW, LeanLayerNorm


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
    @once_differentiable
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        x32 = x.to(torch.float32)
        h = (x32 * rstd).to(x.dtype)
        gw = grad * h  # mul's, summed to the weight's shape
        if gw.dim() > 1:
            gw = gw.sum(dim=tuple(range(gw.dim() - 1)))
        gh = (grad * weight).to(x.dtype).to(torch.float32)  # to h's dtype, then back through the cast
        g_rstd = (gh * x32).sum(-1, keepdim=True)
        g_var = -0.5 * g_rstd * rstd.pow(3)  # rsqrt's
        g_sq = g_var.expand_as(x32) / x32.shape[-1]  # mean's
        gx = gh * rstd + g_sq * (2.0 * x32)  # mul's and pow's, summed
        return gx.to(x.dtype), gw, None


LLAMA_RMS_NORM_FORWARD = """
def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
"""


def _reference_forward():
    """`LLAMA_RMS_NORM_FORWARD` compiled (the formula `_LeanHFRMSNorm` computes)."""
    space: dict = {}
    exec(compile(LLAMA_RMS_NORM_FORWARD, "<LlamaRMSNorm.forward>", "exec"), {"torch": torch}, space)
    return space["forward"]


def _ops(fn) -> list[tuple]:
    """``fn``'s instructions and their arguments (a method's attribute load counted as an
    attribute load: compilers choose between the two for the same source)."""
    return [("LOAD_ATTR" if i.opname == "LOAD_METHOD" else i.opname, i.argval) for i in dis.get_instructions(fn)]


def _lean_rms_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The instance's forward (bound to it, so a deep copy binds to the copy)."""
    w = self.weight
    if x.dtype not in NARROW or w.dtype not in (torch.float32, x.dtype):
        return type(self).forward(self, x)
    with torch.autocast(x.device.type, enabled=False):
        return _LeanHFRMSNorm.apply(x, w, self.variance_epsilon)


def lean_norms(stage: nn.Module) -> int:
    """Make ``stage``'s norms lean in a mixed dtype (above); how many it changed."""
    reference, same, changed = _ops(_reference_forward()), {}, 0
    for module in stage.modules():
        cls = type(module)
        if cls not in same:
            same[cls] = "forward" in cls.__dict__ and _ops(cls.forward) == reference
        if cls is nn.LayerNorm:
            module.__class__ = LeanLayerNorm
        elif same[cls] and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_lean_rms_forward, module)
        else:
            continue
        changed += 1
    return changed
