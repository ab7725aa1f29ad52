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
# kinds whose units weigh differently (modules of this package with ``unit_flops(model)``:
# forward FLOPs of each unit, or None to split evenly; llama's by formula without torch, hf's
# and your module's counted on the model built on the meta device), which
# pipeline.balance=flops splits by; every other kind's units are alike, and split evenly
WEIGHED = {"llama": "llama_shapes", "hf": "hf_flops", "module": "module_flops"}


def extra_units(name: str) -> int:
    """How many split units kind ``name`` has beside its blocks (no torch needed)."""
    return EXTRA_UNITS.get(name, 0)


def unit_count(model) -> int:
    """The split units of ``model`` (a model config): its blocks and its kind's extra units."""
    return model.layers + extra_units(model.kind)


def stage_units(model, num_stages: int, per_stage=None, balance: str = "units", counted: str = "") -> list:
    """Each stage's range of ``model``'s split units (llama's: [embedding, blocks..., head]),
    as ppx splits it into ``num_stages`` (``per_stage``: pipeline.layers_per_stage, or None:
    by ``balance``, pipeline.balance); UserError for a split that cannot be (``counted``: how
    the stage count came, for its line)."""
    from ppx.models.split import split_layers

    weights = split_weights(model, balance)
    return split_layers(model.layers, num_stages, per_stage, extra_units(model.kind), weights, counted)


def split_of(cfg, num_stages: int) -> list:
    """`stage_units` of a whole config: its model, pipeline.layers_per_stage and pipeline.balance."""
    return stage_units(cfg.model, num_stages, cfg.pipeline.layers_per_stage, cfg.pipeline.balance)


def handed_on(cfg, num_stages: int, microbatch_size: int) -> list[tuple[tuple[int, ...], object]]:
    """(shape, dtype) of what each stage but the last hands the next, a microbatch of
    ``microbatch_size`` samples: the kind's one ``boundary``, or, for a kind with
    ``unit_outputs``, the output of each stage's last unit (its split: `split_of`)."""
    kind_ = kind(cfg.model.kind)
    if not hasattr(kind_, "unit_outputs"):
        return [kind_.boundary(cfg.model, microbatch_size)] * (num_stages - 1)
    outputs = kind_.unit_outputs(cfg.model, microbatch_size)
    return [outputs[units.stop - 1] for units in split_of(cfg, num_stages)[:-1]]


def split_weights(model, balance: str) -> tuple[float, ...] | None:
    """What each of ``model``'s units weighs in a split by ``balance`` (pipeline.balance): its
    forward FLOPs under flops, for a kind whose units differ (``WEIGHED``); None (even) else."""
    if balance != "flops" or model.kind not in WEIGHED:
        return None
    flops = importlib.import_module(f"ppx.models.{WEIGHED[model.kind]}").unit_flops(model)
    return None if flops is None else tuple(flops)


def counted_flops(model) -> tuple[float, ...] | None:
    """``split_weights(model, "flops")``, or None where they cannot be had here as well as where
    the kind's units are alike: a module that does not import from this folder (a plan or a
    report read from elsewhere than the run's)."""
    try:
        return split_weights(model, "flops")
    except UserError:
        return None


def preload(model) -> None:
    """Import what building ``model``'s stages imports, in a process whose forks build them
    (torchrun's agent of a CPU run, before it forks its ranks): a Hugging Face model's
    transformers and architecture modules. A user's module is left to each rank (its import
    may do anything)."""
    if model.kind == "hf":
        from ppx.models import hf, hf_config

        hf.meta_model(hf_config.resolve(model))


def kinds_help() -> str:
    """'mlp (Linear+GELU blocks, MSE) | ...', for help texts."""
    return " | ".join(f"{k} ({what})" for k, what in KINDS.items())


def kind(name: str) -> ModelKind:
    """The model kind ``name`` (its module); UserError for an unknown name."""
    if name not in KINDS:
        raise UserError(f"unknown model.kind {name!r}; choose from {', '.join(KINDS)}")
    return importlib.import_module(f"ppx.models.{name}")


def check_split(cfg, num_stages: int, training: bool) -> None:
    """A loaded kind's checks of its split into the schedule's ``num_stages`` (``LOADED``
    modules with ``check_split``: your module's stages begin with floats, in training)."""
    if cfg.model.kind in LOADED:
        spec = importlib.import_module(f"ppx.models.{LOADED[cfg.model.kind]}")
        if hasattr(spec, "check_split"):
            spec.check_split(cfg, num_stages, training)


def shape_defaults(model) -> dict:
    """Model keys a kind reads from what it loads (``LOADED``), set under the experiment's."""
    if model.kind not in LOADED:
        return {}
    return importlib.import_module(f"ppx.models.{LOADED[model.kind]}").shape_defaults(model)


def check(cfg) -> None:
    """A loaded kind's own checks (``LOADED``), one line each, before any process starts."""
    if cfg.model.kind in LOADED:
        importlib.import_module(f"ppx.models.{LOADED[cfg.model.kind]}").check(cfg)
