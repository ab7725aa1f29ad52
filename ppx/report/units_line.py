"""The split a run ran, in one printed line: the units per stage, how they were split
(``pipeline.balance`` or ``pipeline.layers_per_stage``) and each stage's share of the model's
forward FLOPs, for the kinds whose units weigh differently (llama, hf, module)."""

from __future__ import annotations

from ppx import models
from ppx.models.split import split_layers


def flops_shares(cfg, units: list[int]) -> list[float] | None:
    """Each stage's share of the forward FLOPs of the model's units (``units``: units per
    stage), or None for a kind whose units are alike (or not counted here)."""
    weights = models.counted_flops(cfg.model)
    if weights is None or len(weights) != sum(units) or sum(weights) <= 0:
        return None
    total = sum(weights)
    return [sum(weights[r.start : r.stop]) / total for r in split_layers(len(weights), len(units), units)]


def units_line(cfg, units: list[int], shares: list[float] | None) -> str | None:
    """'ppx: units per stage 8, 2 (split by forward FLOPs, pipeline.balance=flops); forward FLOPs
    per stage 53%, 47%', or None where there is nothing to say (units alike)."""
    if shares is None:
        return None
    if cfg.model.kind == "module" and cfg.model.split_points:  # (its checks wrote them to layers_per_stage)
        how = "at model.split_points"
    elif cfg.pipeline.layers_per_stage:
        how = "as pipeline.layers_per_stage gives"
    elif cfg.pipeline.balance == "flops":
        how = "split by forward FLOPs, pipeline.balance=flops"
    else:
        how = "split evenly, pipeline.balance=units"
    counts = ", ".join(map(str, units))
    return f"ppx: units per stage {counts} ({how}); forward FLOPs per stage {', '.join(f'{s:.0%}' for s in shares)}"
