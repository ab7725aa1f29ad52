"""Models split into pipeline stages. Each kind provides ``build_stage``, ``make_batch``,
``loss`` and ``boundary`` (the shape of the activation between stages)."""

from __future__ import annotations

import importlib
from types import ModuleType

from ppx.errors import UserError

KINDS = ("mlp", "transformer", "synthetic")  # modules of this package, imported when first asked for
TRACEABLE = ("mlp", "transformer")  # the kinds that name their blocks (``block_name``) for pipeline.split=tracer


def kind(name: str) -> ModuleType:
    if name not in KINDS:
        raise UserError(f"unknown model.kind {name!r}; choose from {', '.join(KINDS)}")
    return importlib.import_module(f"ppx.models.{name}")
