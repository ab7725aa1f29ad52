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
}
# the kinds that name their blocks (``block_name``) for pipeline.split=tracer
TRACEABLE = ("mlp", "transformer", "llama")
# split units a kind has beside its model.layers blocks (default 0): llama's embedding (the
# first unit) and head (the last) are split like blocks, so pipeline.layers_per_stage sums to
# model.layers + 2 and build_stage gets a range of units
EXTRA_UNITS = {"llama": 2}


def extra_units(name: str) -> int:
    """How many split units kind ``name`` has beside its blocks (no torch needed)."""
    return EXTRA_UNITS.get(name, 0)


def kinds_help() -> str:
    """'mlp (Linear+GELU blocks, MSE) | ...', for help texts."""
    return " | ".join(f"{k} ({what})" for k, what in KINDS.items())


def kind(name: str) -> ModelKind:
    """The model kind ``name`` (its module); UserError for an unknown name."""
    if name not in KINDS:
        raise UserError(f"unknown model.kind {name!r}; choose from {', '.join(KINDS)}")
    return importlib.import_module(f"ppx.models.{name}")
