"""What each split unit of a Hugging Face causal LM (``model.kind=hf``) weighs in
``pipeline.balance=flops``: its forward FLOPs per token, counted on the model built on the meta
device (no memory). A decoder layer: 2 x the weights of its Linear (and GPT-2 ``Conv1D``)
layers, and its attention over the sequence (QK^T and AV, causal: on average half the
positions, or a sliding window's); the embedding, a lookup, none; the final norm and head, the
head's vocabulary matmul. GPT-2's head (vocabulary 50257, hidden 768) weighs 4.9 of its
layers at 1024 tokens, so an even split piles it on the last stage.

A layer holding weights ppx cannot price (a matrix that is not a Linear's, as fused MoE
experts keep theirs) leaves the model split evenly: its units are then weighed by count."""

from __future__ import annotations

import functools

from ppx.errors import UserError
from ppx.models import hf_config

_PRICED = ("Linear", "Conv1D")  # layers whose weight is a matmul's: 2 FLOPs per weight per token
_FREE = ("Embedding",)  # lookups


def unit_flops(model) -> list[float] | None:
    """Forward FLOPs per token of each unit, [embedding, layers..., norm + head], or None when
    a layer holds a weight that is not priced (then the split is even)."""
    return _unit_flops(*hf_config.keys(model), model.seq_len)


@functools.lru_cache(maxsize=16)
def _unit_flops(source: str, overrides: str, shapes: str, seq_len: int) -> list[float] | None:
    from ppx.models import hf, hf_parts

    config = hf_config.resolved(source, overrides, shapes)
    try:
        full = hf.meta_model(config)
        parts = hf_parts.find(full, config.num_hidden_layers)
    except UserError:
        raise
    except Exception:  # transformers refuses this config: the kind's own check says so in one line
        return None
    layers = [_matmuls(layer) for layer in parts.layers[1]]
    if any(f is None for f in layers):
        return None
    heads = getattr(config, "num_attention_heads", None) or 1
    width = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    window = getattr(config, "sliding_window", None) or None  # (0: none)
    kinds = getattr(config, "layer_types", None)
    if kinds is None:  # one window for every layer (Mistral's), unless the config turns it off
        slides = window is not None and getattr(config, "use_sliding_window", True)
        kinds = ["sliding_attention" if slides else "full_attention"] * len(layers)
    attention = [4.0 * width * _context(seq_len, window if kind == "sliding_attention" else None) for kind in kinds]
    head = 2.0 * parts.head.weight.numel()
    return [0.0] + [m + a for m, a in zip(layers, attention)] + [head]


def _matmuls(layer) -> float | None:
    """2 x the weights of ``layer``'s matmul layers; None when it holds another matrix."""
    flops = 0.0
    for module in layer.modules():
        name = type(module).__name__
        own = [p for p in module._parameters.values() if p is not None]
        if name in _PRICED:
            flops += 2.0 * module.weight.numel()
        elif name not in _FREE and any(p.dim() >= 2 for p in own):
            return None
    return flops


def _context(seq_len: int, window: int | None) -> float:
    """The positions a token attends to, on average over ``seq_len`` causal positions (each
    attends to itself and those before it, at most ``window``): the llama kind's seq_len / 2
    where the window holds the sequence."""
    if window is None or window >= seq_len:
        return seq_len / 2
    return window * (1 - window / (2 * seq_len))
