"""The llama kind's shapes without torch: the named presets (``model.preset``), Llama's rule
for the MLP width, and the parameter count by formula. The config reads these before any
process starts, so nothing here imports torch."""

from __future__ import annotations

from ppx.errors import UserError

# model.preset -> the model keys it sets (shapes only: random init, nothing downloaded).
# llama-1b: Llama 3.2 1B; llama-8b: Llama 3 8B; llama-tiny: the same architecture at a size
# a 2-core laptop trains in seconds.
PRESETS: dict[str, dict] = {
    "llama-tiny": dict(
        hidden=64, layers=4, heads=4, kv_heads=2, ffn_hidden=192, vocab_size=256, seq_len=32, rope_theta=10000.0
    ),
    "llama-1b": dict(
        hidden=2048, layers=16, heads=32, kv_heads=8, ffn_hidden=8192, vocab_size=128256, seq_len=2048, rope_theta=5e5
    ),
    "llama-8b": dict(
        hidden=4096, layers=32, heads=32, kv_heads=8, ffn_hidden=14336, vocab_size=128256, seq_len=2048, rope_theta=5e5
    ),
}


def preset(name: str) -> dict:
    """The model keys of preset ``name`` (``kind: llama`` included); UserError naming the presets."""
    if name not in PRESETS:
        raise UserError(f"unknown model.preset {name!r}; choose from {', '.join(PRESETS)}")
    return {"kind": "llama", **PRESETS[name]}


def kv_heads(cfg) -> int:
    """Key/value heads: ``model.kv_heads``, or ``model.heads`` when null (plain multi-head attention)."""
    return cfg.heads if cfg.kv_heads is None else cfg.kv_heads


def ffn_hidden(cfg) -> int:
    """The SwiGLU width: ``model.ffn_hidden``, or Llama's rule when null: 8/3 x hidden rounded
    up to a multiple of 256 (of 32 below hidden 512, so small models stay small)."""
    if cfg.ffn_hidden is not None:
        return cfg.ffn_hidden
    multiple = 256 if cfg.hidden >= 512 else 32
    width = 8 * cfg.hidden // 3
    return -(-width // multiple) * multiple


def param_count(cfg) -> int:
    """Parameters of the whole model (embedding and head untied: they sit on different stages)."""
    h, kv = cfg.hidden, kv_heads(cfg) * (cfg.hidden // cfg.heads)
    attention = 2 * h * h + 2 * h * kv  # wq, wo; wk, wv
    block = attention + 3 * h * ffn_hidden(cfg) + 2 * h  # w1, w2, w3; two RMSNorm weights
    return 2 * cfg.vocab_size * h + cfg.layers * block + h  # embedding, head; final RMSNorm


def unit_flops(cfg) -> list[float]:
    """Forward FLOPs per token of each split unit, [embedding, blocks..., head], by formula: a
    block's matmuls (wq, wk, wv, wo; w1, w2, w3) and its causal attention (half of QK^T and
    AV's 4 x seq_len x hidden), the head's vocabulary matmul; the embedding, a lookup, none.
    What ``pipeline.balance=flops`` splits by: llama-tiny's head weighs a third of a block,
    llama-1b's 4.0 blocks (seq_len 2048)."""
    h, kv = cfg.hidden, kv_heads(cfg) * (cfg.hidden // cfg.heads)
    block = 2 * (2 * h * h + 2 * h * kv + 3 * h * ffn_hidden(cfg)) + 2 * cfg.seq_len * h
    return [0.0] + [float(block)] * cfg.layers + [2.0 * h * cfg.vocab_size]
