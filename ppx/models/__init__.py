"""Models split into pipeline stages. Each kind provides ``build_stage``, ``make_batch``,
``loss`` and ``boundary`` (the shape of the activation between stages)."""

from __future__ import annotations

from types import ModuleType

from ppx.errors import UserError
from ppx.models import mlp, synthetic, transformer

KINDS: dict[str, ModuleType] = {"mlp": mlp, "transformer": transformer, "synthetic": synthetic}


def kind(name: str) -> ModuleType:
    try:
        return KINDS[name]
    except KeyError:
        raise UserError(f"unknown model.kind {name!r}; choose from {', '.join(KINDS)}") from None
