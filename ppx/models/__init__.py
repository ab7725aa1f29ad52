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
}
TRACEABLE = ("mlp", "transformer")  # the kinds that name their blocks (``block_name``) for pipeline.split=tracer


def kinds_help() -> str:
    """'mlp (Linear+GELU blocks, MSE) | ...', for help texts."""
    return " | ".join(f"{k} ({what})" for k, what in KINDS.items())


def kind(name: str) -> ModelKind:
    """The model kind ``name`` (its module); UserError for an unknown name."""
    if name not in KINDS:
        raise UserError(f"unknown model.kind {name!r}; choose from {', '.join(KINDS)}")
    return importlib.import_module(f"ppx.models.{name}")
