"""A small GPT-style decoder: token + position embedding on the first stage, pre-norm
decoder blocks (causal self-attention + MLP), final LayerNorm + vocabulary head and
cross-entropy on the last. Trained on synthetic token sequences (random walks over the
vocabulary), so the loss goes down."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ppx.models.precision_ops import LeanLayerNorm, lean_cross_entropy, to_compute_dtype
from ppx.models.seeding import BLOCK, DATA, EMBEDDING, HEAD, generator, seeded


class DecoderBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn_mult: int):
        super().__init__()
        self.heads = heads
        self.norm1 = LeanLayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = LeanLayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn_mult * hidden), nn.GELU(), nn.Linear(ffn_mult * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(h, dim=-1)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


class TransformerStage(nn.Module):
    """One pipeline stage: [embedding] + decoder blocks + [norm + head]."""

    def __init__(self, cfg, seed: int, first: bool, last: bool, blocks: range):
        super().__init__()
        self.first, self.last = first, last
        if first:
            with seeded(seed, EMBEDDING):
                self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden)
                self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList()
        for i in blocks:
            with seeded(seed, BLOCK + i):
                self.blocks.append(DecoderBlock(cfg.hidden, cfg.heads, cfg.ffn_mult))
        if last:
            with seeded(seed, HEAD):
                self.norm = LeanLayerNorm(cfg.hidden)
                self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = to_compute_dtype(self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device)))
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.head(self.norm(x))
        return x


def build_stage(cfg, seed: int, stage: int, num_stages: int, blocks: range, clock=None) -> nn.Module:
    return TransformerStage(cfg, seed, stage == 0, stage == num_stages - 1, blocks)


def block_name(cfg, block: int) -> str:
    """The submodule where block ``block`` begins in the whole model (a split point)."""
    return f"blocks.{block}"


def make_batch(cfg, seed: int, batch_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (batch, seq_len) and next-token targets: walks that step by 1 or 2 mod vocab."""
    g = generator(seed, DATA + 16 * step)
    start = torch.randint(cfg.vocab_size, (batch_size, 1), generator=g)
    steps = torch.randint(1, 3, (batch_size, cfg.seq_len), generator=g)
    seq = (start + torch.cat([torch.zeros_like(start), steps.cumsum(1)], dim=1)) % cfg.vocab_size
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return lean_cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def boundary(cfg, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
    return (microbatch_size, cfg.seq_len, cfg.hidden), torch.float32
