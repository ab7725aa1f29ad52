"""``model.kind=hf``: a Hugging Face causal LM (Llama, Qwen2, Mistral, GPT-2, GPT-NeoX, and any other laid
out as they are: `ppx.models.hf_parts`) from its config (`ppx.models.hf_config`), randomly
initialised from the seed, split into units like llama's: [token embedding (with GPT-2's
learned positions and dropout), decoder layer 0, ..., decoder layer L-1, final norm + LM head].

A stage holds its units as the original transformers modules, under their Hugging Face
attribute paths (``model.layers.3``, ``lm_head``: a stage's state_dict keys are the
checkpoint's). Only the hidden states travel between stages; each stage builds what its layers
need besides them once per shape (position ids, the rotary embedding's cos and sin, and the
causal mask, sliding-window where the config says, per layer type), as the base model's
forward would. Each unit is initialised by the model's own ``_init_weights`` under its own seed
(`ppx.models.seeding`), so a layer's weights are the same whatever the split, and draws its
dropout masks from a seed of the microbatch and the unit (`seed_unit`), the same whatever the
schedule, the split or a recomputation.

Tied embeddings (GPT-2; any config with ``tie_word_embeddings``): the first stage holds the
token embedding, the last stage a head whose weight starts as that embedding; the engine sums
the two gradients every step (``tied_units``), so both stay equal and the gradients are the
unsplit model's. Data and loss are the transformer kind's (token walks over the vocabulary;
next-token cross-entropy)."""

from __future__ import annotations

import torch
from torch import nn

from ppx.errors import UserError
from ppx.models import hf_config, hf_norms, hf_parts
from ppx.models.precision_ops import to_compute_dtype
from ppx.models.seeding import BLOCK, EMBEDDING, HEAD, seed_unit, seeded
from ppx.models.transformer import boundary, loss, make_batch

__all__ = ["boundary", "build_stage", "loss", "make_batch", "tied_units"]
SEEDS_UNITS = True  # each unit seeds its random ops per microbatch (`seed_unit`): the runtime keys each action
POSITIONS = 5  # the seeding tag of GPT-2's learned positions (the token embedding's is EMBEDDING)


def meta_model(config) -> nn.Module:
    """The whole causal LM on the meta device (its layout, no memory), config as built."""
    tf = hf_config.transformers()
    if type(config) not in tf.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise UserError(
            f"model.kind=hf: {type(config).__name__} has no causal LM in transformers (AutoModelForCausalLM "
            "builds none); ppx splits decoder-only causal LMs (model.kind=module splits any nn.Module)"
        )
    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(config)


def _real(full: nn.Module, module: nn.Module, seed: int, tag: int) -> nn.Module:
    """``module`` (of the meta model ``full``) on the CPU, initialised by the model's own rule
    under seed (``seed``, ``tag``)."""
    _empty_on_cpu(module)
    with seeded(seed, tag), torch.no_grad():
        for sub in module.modules():
            full._init_weights(sub)
    return module


def _empty_on_cpu(module: nn.Module) -> None:
    """``module.to_empty(device="cpu")``, each parameter and buffer replaced, not swapped in
    place (which fails on the fake tensors a plan weighs a model's units with: the meta model
    still holds them), one tensor still one where the module ties it twice."""
    made: dict[int, torch.Tensor] = {}

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            new = torch.empty_like(t, device="cpu")
            made[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
        return made[id(t)]

    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = empty(t)


class HFStage(nn.Module):
    """The units ``units`` of [embedding, layers..., norm + head] of ``config``'s model (a
    Hugging Face config)."""

    def __init__(self, config, seed: int, units: range):
        super().__init__()
        full = meta_model(config)
        n = config.num_hidden_layers
        parts = hf_parts.find(full, n)
        self.config_hf = full.config  # with the attention implementation the layers run
        self.first, self.last = 0 in units, n + 1 in units
        self.names = parts
        base = nn.Module()
        setattr(self, parts.base_name, base)
        if self.first:
            setattr(base, parts.embed[0], _real(full, parts.embed[1], seed, EMBEDDING))
            if parts.positions:
                setattr(base, parts.positions[0], _real(full, parts.positions[1], seed, POSITIONS))
            if parts.dropout:
                setattr(base, parts.dropout[0], parts.dropout[1])
        layers = nn.ModuleDict(
            {str(u - 1): _real(full, parts.layers[1][u - 1], seed, BLOCK + u - 1) for u in units if 1 <= u <= n}
        )
        setattr(base, parts.layers[0], layers)
        if self.last:
            setattr(base, parts.norm[0], _real(full, parts.norm[1], seed, HEAD))
            head = parts.head
            if parts.tied:
                if any(True for n, _ in head.named_parameters() if n != "weight"):
                    raise UserError(
                        f"model.kind=hf: {type(full).__name__}'s tied head has parameters besides its weight"
                    )
                # one stage holding both: the same parameter, as in the unsplit model; else the
                # embedding's initial weight (its own seed), its gradient summed with it every step
                embed = getattr(base, parts.embed[0]) if self.first else _real(full, parts.embed[1], seed, EMBEDDING)
                head.weight = embed.weight
            else:
                _real(full, head, seed, HEAD + 1)
            setattr(self, parts.head_name, head)
        if parts.rotary:  # rebuilt, not materialised: to_empty would leave its frequencies unset
            setattr(base, parts.rotary[0], type(parts.rotary[1])(config=full.config))
        hf_norms.lean_norms(self)  # in a mixed dtype, each norm keeps its input in that dtype
        self._context: dict = {}

    @property
    def base(self) -> nn.Module:
        return getattr(self, self.names.base_name)

    def tied_parameters(self) -> dict[str, nn.Parameter]:
        """This stage's copies of weights tied across stages (``tied_units``)."""
        if not self.names.tied:
            return {}
        out = {}
        if self.first:
            out["embedding"] = getattr(self.base, self.names.embed[0]).weight
        elif self.last:
            out["embedding"] = getattr(self, self.names.head_name).weight
        return out

    def _extras(self, h: torch.Tensor) -> tuple:
        """(position ids, rotary (cos, sin) or None, mask of each layer type) for ``h``'s shape,
        dtype and device: the ids and masks built once, the rotary tables each forward, as the
        model's own forward makes them (the layers save them for their backward: tables shared by
        every microbatch were held once where each microbatch's forward is predicted to hold its
        own, 0.4-15% over on small models)."""
        key = (tuple(h.shape[:2]), h.dtype, h.device)
        got = self._context.get(key)
        if got is None:
            from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            makers = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
            types = {self._layer_type(int(i)) for i in getattr(self.base, self.names.layers[0])}
            if types - set(makers):
                raise UserError(f"model.kind=hf: layer types {sorted(types - set(makers))} have no mask ppx can build")
            with torch.no_grad():
                masks = {kind: _mask(makers[kind], self.config_hf, h, pos) for kind in types}
            got = self._context[key] = (pos, masks)
        pos, masks = got
        rotary = getattr(self.base, self.names.rotary[0]) if self.names.rotary else None
        with torch.no_grad():
            rope = rotary(h, pos) if rotary is not None else None
        return pos, rope, masks

    def _layer_type(self, i: int) -> str:
        types = getattr(self.config_hf, "layer_types", None)
        if types is not None:
            return types[i]
        return "sliding_attention" if getattr(self.config_hf, "sliding_window", None) is not None else "full_attention"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base, names = self.base, self.names
        if self.first:
            seed_unit(0)
            h = getattr(base, names.embed[0])(x)
            if names.positions:
                h = h + getattr(base, names.positions[0])(torch.arange(x.shape[1], device=x.device))
            if names.dropout:
                h = getattr(base, names.dropout[0])(h)
            x = to_compute_dtype(h)  # the residual stream in the compute dtype, whatever the split
        pos, rope, masks = self._extras(x)
        for i, layer in getattr(base, names.layers[0]).items():
            kwargs = {"attention_mask": masks[self._layer_type(int(i))], "position_ids": pos}
            if rope is not None:
                kwargs["position_embeddings"] = rope
            seed_unit(int(i) + 1)
            out = layer(x, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
        if self.last:
            x = getattr(self, names.head_name)(getattr(base, names.norm[0])(x))
        return x


def _mask(make, config_hf, h: torch.Tensor, pos: torch.Tensor):
    """A layer type's attention mask for ``h``'s shape (None where SDPA's causal flag does its
    work). On fake tensors (`ppx.plan.unit_weights`) transformers takes its tracing path, a
    mask where a real run has none (and, beside it, K and V repeated over the query heads): so
    there it is made on a real input of that shape, an expanded zero (the mask itself, where a
    layer has one, a sliding window's, is real memory: one per shape)."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    if not isinstance(h, FakeTensor):
        return make(config=config_hf, inputs_embeds=h, attention_mask=None, cache=None, position_ids=pos)
    with unset_fake_temporarily():
        real = torch.zeros((), dtype=h.dtype).expand(h.shape)
        at = torch.arange(h.shape[1]).unsqueeze(0)
        return make(config=config_hf, inputs_embeds=real, attention_mask=None, cache=None, position_ids=at)


def build_stage(cfg, seed: int, stage: int, num_stages: int, blocks: range, clock=None) -> nn.Module:
    """``blocks`` is a range of split units: 0 the embedding, 1..layers the decoder layers,
    layers + 1 the final norm and head."""
    return HFStage(hf_config.resolve(cfg), seed, blocks)


def tied_units(cfg) -> dict[str, tuple[int, ...]]:
    """Units that hold a copy of one weight, by name: the token embedding and the head when the
    config ties them (the engine sums their gradients every step)."""
    if getattr(hf_config.resolve(cfg), "tie_word_embeddings", False):
        return {"embedding": (0, cfg.layers + 1)}
    return {}
