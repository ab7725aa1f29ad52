"""A user's own small GPT, outside ppx: what `model.kind=module` pipelines.

    ppx run examples/tiny_gpt.yaml              # 1F1B on 2 CPU processes
    ppx run examples/tiny_gpt.yaml pipeline.schedule=zbv

`build(model)` gets the config's model section and returns the nn.Module; the YAML names the
units its forward calls in turn (`embed`, each of `blocks`, `head`). The head's weight is the
embedding's (tied): ppx sums the two stages' gradients every step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ppx.models.precision_ops import to_compute_dtype


class Embed(nn.Module):
    def __init__(self, vocab: int, width: int, seq_len: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)
        for table in (self.tokens, self.positions):
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        # in bf16 (fp16) the residual stream in the compute dtype from here, as on every later
        # stage (the pipeline sends it so): the same losses however the blocks are split
        return to_compute_dtype(x)


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.norm1(x)).split(w, -1))
        x = x + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Head(nn.Module):
    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int, seq_len: int, tied: bool):
        super().__init__()
        self.embed = Embed(vocab, width, seq_len)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.head = Head(width, vocab)
        if tied:
            self.head.proj.weight = self.embed.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(model) -> nn.Module:
    """ppx calls this with the config's model section: the shapes from its keys."""
    a = model.args
    return TinyGPT(
        model.vocab_size, a.get("width", 32), a.get("depth", 4), a.get("heads", 2), model.seq_len, a.get("tied", True)
    )
