"""The built-in models' mixed-precision pieces (`ppx.models.precision_ops`): in fp32 they are
torch's own ops; in bf16 they compute in fp32 and keep what their backward needs in bf16 with
fp32 statistics per token, so a bf16 microbatch saves about half an fp32 one's bytes on every
device (CUDA's autocast runs layer_norm and cross_entropy in fp32, and their graphs would keep
fp32 copies)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ppx import config, models
from ppx.engine.precision import Precision
from ppx.engine.rank import build_runners, build_stage_modules, sample_microbatch
from ppx.engine.split_setup import set_up_split
from ppx.models.precision_ops import LeanLayerNorm, lean_cross_entropy, lean_layer_norm


def _saved(fn, *args):
    """``fn(*args)`` and the tensors its graph saved."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, saved


def _layer_norm_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 8, 64, generator=g) * 3 + 1).to(dtype).requires_grad_(True)
    w = (torch.randn(64, generator=g) * 0.5 + 1).requires_grad_(True)  # fp32 masters
    b = (torch.randn(64, generator=g) * 0.1).requires_grad_(True)
    return x, w, b, torch.randn(4, 8, 64, generator=g).to(dtype)


def test_layer_norm_in_fp32_is_torchs_own():
    x, w, b, gy = _layer_norm_inputs(torch.float32)
    y = lean_layer_norm(x, (64,), w, b, 1e-5)
    ref = F.layer_norm(x, (64,), w, b, 1e-5)
    assert torch.equal(y, ref)
    for a, r in zip(torch.autograd.grad(y, [x, w, b], gy), torch.autograd.grad(ref, [x, w, b], gy)):
        assert torch.equal(a, r)


@pytest.mark.parametrize("autocast", [False, True])
def test_layer_norm_in_bf16_is_cudas_autocast_to_the_bit_and_keeps_the_input_in_bf16(autocast):
    """CUDA's autocast: layer_norm on the fp32 input and weights, an fp32 output."""
    x, w, b, gy = _layer_norm_inputs(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y, saved = _saved(lean_layer_norm, x, (64,), w, b, 1e-5)
    ref = F.layer_norm(x.float(), (64,), w, b, 1e-5)
    assert y.dtype == torch.float32 and torch.equal(y, ref)
    got = torch.autograd.grad(y, [x, w, b], gy.float(), retain_graph=True)
    want = torch.autograd.grad(ref, [x, w, b], gy.float())
    with pytest.raises(RuntimeError):  # once_differentiable: a second backward fails, never silently wrong
        torch.autograd.grad(torch.autograd.grad(y, x, gy.float(), create_graph=True)[0].sum(), x)
    assert [g.dtype for g in got] == [torch.bfloat16, torch.float32, torch.float32]
    for a, r in zip(got, want):
        assert torch.equal(a, r)
    activations = [t for t in saved if t.numel() == x.numel()]
    assert [t.dtype for t in activations] == [torch.bfloat16]  # no fp32 copy
    assert sum(t.numel() for t in saved if t.dtype == torch.float32) == 2 * 4 * 8 + 2 * 64  # mean, rstd; w, b


def _logits(dtype):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(96, 200, generator=g) * 4).to(dtype).requires_grad_(True)
    return logits, torch.randint(200, (96,), generator=g)


def test_cross_entropy_in_fp32_is_torchs_own():
    logits, target = _logits(torch.float32)
    loss, ref = lean_cross_entropy(logits, target), F.cross_entropy(logits, target)
    assert torch.equal(loss, ref)
    assert torch.equal(torch.autograd.grad(loss, logits)[0], torch.autograd.grad(ref, logits)[0])


@pytest.mark.parametrize("autocast", [False, True])
def test_cross_entropy_in_bf16_is_the_fp32_loss_and_keeps_the_logits_in_bf16(autocast):
    logits, target = _logits(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, saved = _saved(lean_cross_entropy, logits, target)
    ref = F.cross_entropy(logits.float(), target)  # what autocast computes, on every device
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(ref.item(), rel=1e-6)
    got, want = torch.autograd.grad(loss * 3, logits)[0], torch.autograd.grad(ref * 3, logits)[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.to(torch.bfloat16), rtol=2**-7, atol=1e-6)  # one bf16 rounding
    assert [t.dtype for t in saved if t.numel() == logits.numel()] == [torch.bfloat16]  # no fp32 log-softmax
    assert sum(t.numel() for t in saved if t.dtype == torch.float32) == 96  # the log-sum-exp per token


MODELS = {
    "transformer": ["model.kind=transformer", "model.hidden=64", "model.layers=2", "model.heads=4"],
    "llama": ["model.kind=llama", "model.hidden=64", "model.layers=2", "model.heads=4", "model.kv_heads=2"],
    "hf-llama": ["model.kind=hf", "model.hf_config=llama", "model.hidden=64", "model.layers=2", "model.heads=4"]
    + ["model.hf_overrides={num_key_value_heads: 2, intermediate_size: 128}"],
    "hf-gpt2": ["model.kind=hf", "model.hf_config=gpt2", "model.hidden=64", "model.layers=2", "model.heads=4"]
    + ["model.hf_overrides={resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}"],
}


def _microbatch_bytes(model: str, dtype: str) -> tuple[int, list[torch.Tensor]]:
    """Bytes one microbatch's forward saves through the whole model on one stage, as ppx's
    memory counter counts them (each storage once; no parameter, no step's weight copy), and
    the saved fp32 tensors."""
    cfg = config.load(None, MODELS[model] + ["model.seq_len=24", "model.vocab_size=96", f"train.dtype={dtype}"])
    cfg.pipeline.stages = 1
    modules = build_stage_modules(cfg, 1, [0], "cpu")
    precision = Precision(dtype, "cpu")
    (runner,) = build_runners(cfg, modules, 1, 1, precision, set()).values()
    set_up_split(cfg, runner, False, sample_microbatch(cfg, precision, 1, "cpu"))  # a mixed dtype's weight copies
    kind = models.kind(cfg.model.kind)
    x, y = kind.make_batch(cfg.model, 0, 3, 0)
    runner.new_step()
    _, saved = _saved(runner.forward, 0, x, y)
    assert runner.weights._last_cast is None  # (the forward's shared casts end with it)
    skip = {p.untyped_storage().data_ptr() for p in runner.module.parameters()}
    skip |= runner.weights.storages
    kept = {t.untyped_storage().data_ptr(): t for t in saved if t.untyped_storage().data_ptr() not in skip}
    nbytes = sum(t.untyped_storage().nbytes() for t in kept.values())
    return nbytes, [t for t in kept.values() if t.dtype == torch.float32]


@pytest.mark.parametrize("model", list(MODELS))
def test_a_bf16_microbatch_saves_about_half_an_fp32_ones_bytes(model):
    fp32, _ = _microbatch_bytes(model, "fp32")
    bf16, wide = _microbatch_bytes(model, "bf16")
    # Hugging Face's Llama saves under half: in fp32 its RMSNorm's graph keeps the input and the
    # normalised input (8 bytes an element), in bf16 the lean norm its bf16 input (2 bytes); and
    # its q, k, v (gate, up) share one bf16 copy of the norm's fp32 output (a copy each: 0.53)
    low, high = (0.40, 0.47) if model == "hf-llama" else (0.45, 0.55)
    assert low <= bf16 / fp32 <= high, (bf16, fp32)
    tokens = 3 * 24
    assert all(t.numel() <= 4 * tokens for t in wide), [tuple(t.shape) for t in wide]  # per-token statistics only


@pytest.mark.parametrize("autocast", [False, True])
def test_hf_rms_norm_in_bf16_is_the_modules_own_to_the_bit_and_keeps_the_input_in_bf16(autocast):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from ppx.models.hf_norms import lean_norms

    ref_norm = LlamaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        ref_norm.weight.mul_(torch.linspace(0.5, 1.5, 64))
    lean = nn.Sequential(copy.deepcopy(ref_norm))
    assert lean_norms(lean) == 1
    x, _, _, _ = _layer_norm_inputs(torch.bfloat16)
    gy = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(3))  # the output is fp32 (the weight's)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ref = ref_norm(x)
        y, saved = _saved(lean, x)
    assert y.dtype == ref.dtype == torch.float32 and torch.equal(y, ref)
    got = torch.autograd.grad(y, [x, lean[0].weight], gy)
    want = torch.autograd.grad(ref, [x, ref_norm.weight], gy)
    for a, r in zip(got, want):
        assert a.dtype == r.dtype and torch.equal(a, r)
    assert [t.dtype for t in saved if t.numel() == x.numel()] == [torch.bfloat16]  # no fp32 copy
    x32 = x.detach().float().requires_grad_(True)  # fp32: the module's own forward
    assert torch.equal(lean(x32), ref_norm(x32))


def test_layer_norm_over_two_dimensions():
    g = torch.Generator().manual_seed(2)
    norm = nn.LayerNorm((8, 64))
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, 64, generator=g))
    lean = copy.deepcopy(norm)
    lean.__class__ = LeanLayerNorm
    x, _, _, gy = _layer_norm_inputs(torch.bfloat16)
    ref = norm(x.float())
    y = lean(x)
    assert torch.equal(y, ref) and torch.equal(lean(x.float()), ref)
    got = torch.autograd.grad(y, [x, lean.weight, lean.bias], gy)
    want = torch.autograd.grad(ref, [x, norm.weight, norm.bias], gy.float())
    for a, r in zip(got, want):
        assert torch.equal(a, r)


def test_hf_rms_norm_matching_is_the_formula_not_the_name():
    """transformers' LlamaRMSNorm (and its copies) match the formula ppx keeps; a norm that
    computes otherwise under the same attributes is left alone; a bf16 weight (FSDP2's mixed
    precision) and a 1-D input take the lean way too, with the module's own values."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    from ppx.models.hf_norms import lean_norms

    class OtherRMSNorm(LlamaRMSNorm):  # Olmo2's: the weight applied before the cast back
        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return (self.weight * hidden_states).to(input_dtype)

    assert lean_norms(nn.Sequential(LlamaRMSNorm(8), Qwen2RMSNorm(8), OtherRMSNorm(8), nn.LayerNorm(8))) == 3
    assert "forward" not in OtherRMSNorm(8).__dict__
    for weight_dtype, shape in ((torch.bfloat16, (4, 8, 64)), (torch.float32, (64,))):
        ref_norm = LlamaRMSNorm(64).to(weight_dtype)
        lean = nn.Sequential(copy.deepcopy(ref_norm))
        lean_norms(lean)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).requires_grad_(True)
        y, saved = _saved(lean, x)
        ref = ref_norm(x)
        assert torch.equal(y, ref)
        gy = torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(y.dtype)
        for a, r in zip(
            torch.autograd.grad(y, [x, lean[0].weight], gy), torch.autograd.grad(ref, [x, ref_norm.weight], gy)
        ):
            assert torch.equal(a, r)
        copies = [t for t in saved if t.dtype == torch.float32 and t.numel() == x.numel()]
        assert not [t for t in copies if t.data_ptr() != lean[0].weight.data_ptr()]  # lean: no fp32 copy of x
