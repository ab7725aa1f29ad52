"""The llama kind (ppx.models.llama): shapes of the presets without allocating them, the split
that counts the embedding and the head, attention and rotary embeddings against a naive
implementation, the presets' layering ("keys given beside it win") and the one-line errors."""

from __future__ import annotations

import math

import pytest
import torch

from ppx import config
from ppx.engine.rank import build_reference, build_stage_modules
from ppx.errors import UserError
from ppx.models import llama
from ppx.models.llama_shapes import PRESETS, ffn_hidden, param_count


def load(*overrides: str, exp: str | None = None):
    return config.load(exp, list(overrides))


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_count_by_formula_equals_a_meta_build(name):
    cfg = load(f"model.preset={name}")
    with torch.device("meta"):  # llama-8b's 8 billion parameters, no bytes allocated
        model = build_reference(cfg, device="meta")
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg.model)


def test_llama_1b_and_8b_have_the_published_sizes():
    one, eight = load("model.preset=llama-1b").model, load("model.preset=llama-8b").model
    # Llama 3.2 1B ties its head to the embedding (1.24B); ppx's head sits on the last stage, untied
    assert param_count(one) - one.vocab_size * one.hidden == pytest.approx(1.24e9, rel=0.005)
    assert param_count(one) == pytest.approx(1.50e9, rel=0.005)
    assert param_count(eight) == pytest.approx(8.03e9, rel=0.001)  # Llama 3 8B: untied


def test_ffn_width_follows_llamas_rule_when_null():
    m = load("model.kind=llama", "model.hidden=4096", "model.heads=32").model
    assert m.ffn_hidden is None and ffn_hidden(m) == 11008  # Llama 2 7B's width
    assert ffn_hidden(load("model.kind=llama").model) == 192  # hidden 64: 170.7 up to a multiple of 32


@pytest.mark.parametrize(
    "balance, blocks",
    [
        ("units", [4, 5, 4, 3]),  # units 5,5,4,4 of [emb, 16 blocks, head]
        ("flops", [5, 5, 5, 1]),  # llama-1b's head weighs 4 blocks: it rides with one block
    ],
)
def test_the_split_counts_the_embedding_and_the_head(balance, blocks):
    cfg = load("model.preset=llama-1b", "pipeline.stages=4", f"pipeline.balance={balance}")
    with torch.device("meta"):
        mods = build_stage_modules(cfg, 4, range(4), "meta")
    assert [len(m.blocks) for m in mods.values()] == blocks
    assert [hasattr(m, "tok") for m in mods.values()] == [True, False, False, False]
    assert [hasattr(m, "head") for m in mods.values()] == [False, False, False, True]


@pytest.mark.parametrize("split", [[1, 4, 1], [2, 3, 1], [1, 1, 4]])
def test_any_split_computes_the_whole_model_with_the_same_weights(split):
    """A stage may hold the embedding alone or the head alone; block weights follow the block."""
    cfg = load("model.preset=llama-tiny", "pipeline.stages=3", f"pipeline.layers_per_stage={split}")
    mods = build_stage_modules(cfg, 3, range(3), "cpu")
    ref = build_reference(cfg)
    x, _ = llama.make_batch(cfg.model, 0, 2, 0)
    out = x
    for s in range(3):
        out = mods[s](out)
    torch.testing.assert_close(out, ref(x), rtol=0, atol=0)
    params = [p for s in range(3) for p in mods[s].parameters()]
    assert all(torch.equal(p, q) for p, q in zip(params, ref.parameters(), strict=True))


def naive_block(block, x: torch.Tensor, theta: float) -> torch.Tensor:
    """RMSNorm, GQA with complex-number rotary embeddings and a masked softmax per head, SwiGLU."""
    att = block.attention
    b, t, _ = x.shape
    heads, kv, d = att.heads, att.kv, att.head_dim

    def rms(z, norm):
        return z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight

    angle = torch.arange(t, dtype=x.dtype)[:, None] * theta ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    turn = torch.polar(torch.ones_like(angle), angle)  # e^(i angle), (t, d/2)

    def rope(z):  # (b, t, n, d): pairs (2i, 2i+1) as complex numbers, turned
        zc = torch.view_as_complex(z.reshape(b, t, -1, d // 2, 2).contiguous())
        return torch.view_as_real(zc * turn[None, :, None, :]).reshape(b, t, -1, d)

    h = rms(x, block.attention_norm)
    q = rope((h @ att.wq.weight.T).view(b, t, heads, d))
    k = rope((h @ att.wk.weight.T).view(b, t, kv, d))
    v = (h @ att.wv.weight.T).view(b, t, kv, d)
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    out = torch.zeros(b, t, heads, d, dtype=x.dtype)
    for head in range(heads):
        g = head // (heads // kv)  # the key/value head this query head shares
        scores = (q[:, :, head] @ k[:, :, g].transpose(1, 2) / math.sqrt(d)).masked_fill(mask, -math.inf)
        out[:, :, head] = scores.softmax(-1) @ v[:, :, g]
    x = x + out.reshape(b, t, heads * d) @ att.wo.weight.T
    ff = block.feed_forward
    h = rms(x, block.ffn_norm)
    return x + (torch.nn.functional.silu(h @ ff.w1.weight.T) * (h @ ff.w3.weight.T)) @ ff.w2.weight.T


@pytest.mark.parametrize("heads,kv", [(4, 2), (4, 1), (4, 4)])
def test_block_equals_a_naive_implementation(heads, kv):
    cfg = load("model.kind=llama", "model.hidden=32", f"model.heads={heads}", f"model.kv_heads={kv}",
               "model.seq_len=8", "model.rope_theta=100")  # fmt: skip
    torch.manual_seed(0)
    block = llama.LlamaBlock(cfg.model).double()
    for p in block.parameters():  # norms too: not all ones
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    cos, sin = llama.rope_table(32 // heads, 8, 100.0)
    torch.testing.assert_close(block(x, cos, sin), naive_block(block, x, 100.0))


def test_rotary_embedding_makes_scores_depend_on_relative_position_only():
    cos, sin = llama.rope_table(8, 16, 10000.0)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)

    def score(i, j):
        qi = llama.rotate(q.expand(1, 1, 16, 8), cos.double(), sin.double())[0, 0, i]
        kj = llama.rotate(k.expand(1, 1, 16, 8), cos.double(), sin.double())[0, 0, j]
        return qi @ kj

    assert score(5, 3) == pytest.approx(score(12, 10).item()) and score(0, 0) == pytest.approx((q @ k).item())


def test_preset_keys_given_beside_it_win(tmp_path):
    cfg = load("model.preset=llama-1b", "model.layers=2")
    assert (cfg.model.kind, cfg.model.hidden, cfg.model.layers, cfg.model.kv_heads) == ("llama", 2048, 2, 8)
    exp = tmp_path / "mine.yaml"
    exp.write_text("model:\n  preset: llama-8b\n  hidden: 512\n  heads: 8\n")
    cfg = load("model.heads=16", exp=str(exp))  # defaults <- preset <- experiment <- command line
    assert (cfg.model.hidden, cfg.model.heads, cfg.model.layers, cfg.model.ffn_hidden) == (512, 16, 32, 14336)
    cfg = load("model.preset=llama-tiny", exp=str(exp))  # the preset given last is the one, under the YAML
    assert (cfg.model.preset, cfg.model.hidden, cfg.model.heads, cfg.model.layers) == ("llama-tiny", 512, 8, 4)
    assert cfg.model.kv_heads == 2 and cfg.model.seq_len == 32
    assert load("model.preset=llama-tiny", "model.kind=llama").model.kind == "llama"


BAD = {
    "unknown preset": (["model.preset=llama-2"], "unknown model.preset 'llama-2'; choose from llama-tiny, llama-1b"),
    "preset of another kind": (["model.preset=llama-tiny", "model.kind=mlp"], "model.kind=mlp; drop model.kind"),
    "kv heads": (["model.kind=llama", "model.kv_heads=3"], "model.kv_heads=3 must divide model.heads=4"),
    "odd head dim": (["model.kind=llama", "model.hidden=40", "model.heads=8"], "(the head dim) must be even"),
    "heads": (["model.kind=llama", "model.heads=3"], "model.hidden=64 is not divisible by model.heads=3"),
    "rope theta": (["model.kind=llama", "model.rope_theta=0"], "model.rope_theta must be a finite number > 1"),
    "ffn": (["model.kind=llama", "model.ffn_hidden=0"], "model.ffn_hidden must be >= 1"),
    "split sum": (
        ["model.preset=llama-tiny", "pipeline.layers_per_stage=[2,2]"],
        "pipeline.layers_per_stage=[2, 2] must be positive and sum to model.layers + 2 = 6",
    ),
    "too many stages": (["model.preset=llama-tiny", "pipeline.stages=7"], "7 stages but model.layers + 2 = 6"),
    "fallback": (["runtime.cpu_fallback=[model.preset]"], "runtime.cpu_fallback: 'model.preset' must look like"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_keys_give_one_line_naming_the_key(case):
    overrides, expected = BAD[case]
    with pytest.raises(UserError) as e:
        load(*overrides)
    assert expected in str(e.value) and "\n" not in str(e.value)
