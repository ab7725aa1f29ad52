"""A Llama-style decoder: token embedding on the first stage; pre-norm blocks of RMSNorm,
grouped-query attention with rotary position embeddings (SDPA, causal) and a SwiGLU MLP, no
biases; final RMSNorm + vocabulary head + cross-entropy on the last stage. Trained on the
transformer kind's synthetic token walks, so the loss goes down. Shapes by name in
`ppx.models.llama_shapes` (``model.preset``).

The layer split counts the embedding and the head as units of their own (``EXTRA_UNITS`` in
`ppx.models`): units are [embedding, block 0, ..., block layers-1, head], and ``build_stage``
receives a range of units, so a stage may hold the embedding alone, or the head alone."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ppx.models.llama_shapes import ffn_hidden, kv_heads
from ppx.models.precision_ops import lean_rms_norm, to_compute_dtype
from ppx.models.seeding import BLOCK, EMBEDDING, HEAD, seeded
from ppx.models.transformer import boundary, loss, make_batch

__all__ = ["boundary", "build_stage", "block_name", "loss", "make_batch", "rope_table", "rotate"]

EPS = 1e-5  # RMSNorm's epsilon, as Llama 3's


def rope_table(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, (seq_len, head_dim / 2): position t turns the pair
    of dimensions (2i, 2i+1) by t / theta^(2i / head_dim)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (batch, heads, seq, head_dim), pairs (2i, 2i+1) as in Meta's Llama."""
    cos, sin = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    """x / rms(x) x weight, computed in fp32 at least whatever the input's dtype (as Meta's
    Llama does: under bf16 autocast the input is bf16 and the weight an fp32 master), returned
    in the input's dtype."""

    def __init__(self, dim: int, eps: float = EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lean_rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention: ``heads`` query heads share ``kv_heads`` key/value heads."""

    def __init__(self, hidden: int, heads: int, kv: int):
        super().__init__()
        self.heads, self.kv, self.head_dim = heads, kv, hidden // heads
        self.wq = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(hidden, kv * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.heads)
        return self.wo(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x). Registered in the order forward uses them, the order the
    tracer's GraphModules list them in (pipeline.split=tracer)."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, width, bias=False)
        self.w3 = nn.Linear(hidden, width, bias=False)
        self.w2 = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden)
        self.attention = Attention(cfg.hidden, cfg.heads, kv_heads(cfg))
        self.ffn_norm = RMSNorm(cfg.hidden)
        self.feed_forward = FeedForward(cfg.hidden, ffn_hidden(cfg))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class LlamaStage(nn.Module):
    """One pipeline stage: the units ``units`` of [embedding, blocks..., norm + head]."""

    def __init__(self, cfg, seed: int, units: range):
        super().__init__()
        head_unit = cfg.layers + 1
        self.first, self.last = 0 in units, head_unit in units
        if self.first:
            with seeded(seed, EMBEDDING):
                self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList()
        for u in units:
            if 1 <= u <= cfg.layers:
                with seeded(seed, BLOCK + u - 1):
                    self.blocks.append(LlamaBlock(cfg))
        if self.last:
            with seeded(seed, HEAD):
                self.norm = RMSNorm(cfg.hidden)
                self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        cos, sin = rope_table(cfg.hidden // cfg.heads, cfg.seq_len, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = to_compute_dtype(self.tok(x))  # the residual stream in the compute dtype
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        if self.last:
            x = self.head(self.norm(x))
        return x


def build_stage(cfg, seed: int, stage: int, num_stages: int, blocks: range, clock=None) -> nn.Module:
    """``blocks`` is a range of split units: 0 the embedding, 1..layers the blocks, layers + 1 the head."""
    return LlamaStage(cfg, seed, blocks)


def block_name(cfg, block: int) -> str:
    """The submodule where split unit ``block`` begins in the whole model (a split point)."""
    return f"blocks.{block - 1}" if block <= cfg.layers else "norm"
