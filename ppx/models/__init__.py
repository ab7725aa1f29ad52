"""Models split into pipeline stages: each kind is a module of this package implementing
`ppx.models.kind.ModelKind`. Adding a model = one module + its name in ``KINDS``."""

from __future__ import annotations

import importlib

from ppx.errors import UserError
from ppx.models.kind import ModelKind

# modules of this package (imported when first asked for) and what each is, for the config's help
KINDS = {
    "mlp": "Linear+GELU blocks, MSE",
    "transformer": "GPT-style decoder, cross-entropy",
    "synthetic": "known costs per stage or per layer",
    "llama": "Llama-style decoder: RMSNorm, GQA + RoPE, SwiGLU; model.preset",
    "hf": "a Hugging Face causal LM from its config: model.hf_config",
    "module": "your own nn.Module by import path: model.module, model.units",
}
# the kinds that name their blocks (``block_name``) for pipeline.split=tracer
TRACEABLE = ("mlp", "transformer", "llama", "module")
# split units a kind has beside its model.layers blocks (default 0): llama's embedding (the
# first unit) and head (the last) are split like blocks, so pipeline.layers_per_stage sums to
# model.layers + 2 and build_stage gets a range of units
EXTRA_UNITS = {"llama": 2, "hf": 2}
# kinds whose keys are read from what they load (torch-free modules of this package, imported
# only for those kinds): ``shape_defaults(model)`` gives model keys under the experiment's (as
# a preset does) and ``check(cfg)`` checks the config before any process starts
LOADED = {"hf": "hf_config", "module": "module_spec"}


def extra_units(name: str) -> int:
    """How many split units kind ``name`` has beside its blocks (no torch needed)."""
    return EXTRA_UNITS.get(name, 0)


def unit_count(model) -> int:
    """The split units of ``model`` (a model config): its blocks and its kind's extra units."""
    return model.layers + extra_units(model.kind)


def stage_units(model, num_stages: int, per_stage=None) -> list:
    """Each stage's range of ``model``'s split units (llama's: [embedding, blocks..., head]),
    as ppx splits it into ``num_stages`` (``per_stage``: pipeline.layers_per_stage, or None:
    even); UserError for a split that cannot be."""
    from ppx.models.split import split_layers

    return split_layers(model.layers, num_stages, per_stage, extra_units(model.kind))


def kinds_help() -> str:
    """'mlp (Linear+GELU blocks, MSE) | ...', for help texts."""
    return " | ".join(f"{k} ({what})" for k, what in KINDS.items())


def kind(name: str) -> ModelKind:
    """The model kind ``name`` (its module); UserError for an unknown name."""
    if name not in KINDS:
        raise UserError(f"unknown model.kind {name!r}; choose from {', '.join(KINDS)}")
    return importlib.import_module(f"ppx.models.{name}")


def shape_defaults(model) -> dict:
    """Model keys a kind reads from what it loads (``LOADED``), set under the experiment's."""
    if model.kind not in LOADED:
        return {}
    return importlib.import_module(f"ppx.models.{LOADED[model.kind]}").shape_defaults(model)


def check(cfg) -> None:
    """A loaded kind's own checks (``LOADED``), one line each, before any process starts."""
    if cfg.model.kind in LOADED:
        importlib.import_module(f"ppx.models.{LOADED[cfg.model.kind]}").check(cfg)
