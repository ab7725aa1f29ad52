"""Split a model's blocks over pipeline stages: even by default, or an explicit list."""

from __future__ import annotations

from collections.abc import Sequence

from ppx.errors import UserError


def split_layers(layers: int, stages: int, per_stage: Sequence[int] | None = None, extra: int = 0) -> list[range]:
    """Unit index ranges, one per stage, over ``layers`` blocks plus the kind's ``extra`` units
    (`ppx.models.extra_units`: llama's embedding and head, then units are [embedding, blocks...,
    head]). Even: the first ``units % stages`` stages get one unit more. Explicit: ``per_stage``
    lists the units of each stage (each >= 1, summing to ``layers + extra``)."""
    units = layers + extra
    what = (
        f"model.layers={layers}"
        if not extra
        else f"model.layers + {extra} = {units} (the embedding and the head are units of the split)"
    )
    if per_stage is not None:
        per_stage = list(per_stage)
        if len(per_stage) != stages:
            raise UserError(f"pipeline.layers_per_stage has {len(per_stage)} entries but there are {stages} stages")
        if any(n < 1 for n in per_stage) or sum(per_stage) != units:
            raise UserError(f"pipeline.layers_per_stage={per_stage} must be positive and sum to {what}")
        counts = per_stage
    else:
        if stages > units:
            unit = "one layer" if not extra else "one unit"
            raise UserError(f"{stages} stages but {what}: every stage needs at least {unit}")
        base, rest = divmod(units, stages)
        counts = [base + (1 if s < rest else 0) for s in range(stages)]
    ranges, start = [], 0
    for n in counts:
        ranges.append(range(start, start + n))
        start += n
    return ranges
