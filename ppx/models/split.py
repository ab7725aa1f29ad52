"""Split a model's blocks over pipeline stages: even by default, or an explicit list."""

from __future__ import annotations

from collections.abc import Sequence

from ppx.errors import UserError


def split_layers(layers: int, stages: int, per_stage: Sequence[int] | None = None) -> list[range]:
    """Block index ranges, one per stage. Even: the first ``layers % stages`` stages get one
    block more. Explicit: ``per_stage`` lists the blocks of each stage (each >= 1, summing to
    ``layers``)."""
    if per_stage is not None:
        per_stage = list(per_stage)
        if len(per_stage) != stages:
            raise UserError(f"pipeline.layers_per_stage has {len(per_stage)} entries but there are {stages} stages")
        if any(n < 1 for n in per_stage) or sum(per_stage) != layers:
            raise UserError(f"pipeline.layers_per_stage={per_stage} must be positive and sum to model.layers={layers}")
        counts = per_stage
    else:
        if stages > layers:
            raise UserError(f"{stages} stages but model.layers={layers}: every stage needs at least one layer")
        base, extra = divmod(layers, stages)
        counts = [base + (1 if s < extra else 0) for s in range(stages)]
    ranges, start = [], 0
    for n in counts:
        ranges.append(range(start, start + n))
        start += n
    return ranges
