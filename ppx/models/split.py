"""Split a model's units over pipeline stages: balanced by their weights (forward FLOPs) or
even, or an explicit list."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from ppx.errors import UserError


def split_layers(
    layers: int,
    stages: int,
    per_stage: Sequence[int] | None = None,
    extra: int = 0,
    weights: Sequence[float] | None = None,
    counted: str = "",
) -> list[range]:
    """Unit index ranges, one per stage, over ``layers`` blocks plus the kind's ``extra`` units
    (`ppx.models.extra_units`: llama's embedding and head, then units are [embedding, blocks...,
    head]). Even: the first ``units % stages`` stages get one unit more. Balanced (``weights``,
    one per unit): `balanced_counts`. Explicit: ``per_stage`` lists the units of each stage
    (each >= 1, summing to ``layers + extra``). ``counted``: how the stage count came, for its
    line (several stages a rank)."""
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
            how = f" ({counted})" if counted else ""
            raise UserError(f"{stages} stages{how} but {what}: every stage needs at least {unit}")
        counts = even_counts(units, stages)
        if weights is not None and len(weights) == units:
            counts = list(balanced_counts(tuple(float(w) for w in weights), stages))
    ranges, start = [], 0
    for n in counts:
        ranges.append(range(start, start + n))
        start += n
    return ranges


def even_counts(units: int, stages: int) -> list[int]:
    """Units per stage, even: the first ``units % stages`` stages one more."""
    base, rest = divmod(units, stages)
    return [base + (1 if s < rest else 0) for s in range(stages)]


@lru_cache(maxsize=256)
def balanced_counts(weights: tuple[float, ...], stages: int) -> tuple[int, ...]:
    """Units per stage, contiguous and at least one each, whose heaviest stage (the sum of its
    units' ``weights``) is as light as any split's; among those, the one whose stages are most
    alike (the least sum of their squared weights: GPT-2's head alone on a stage, then 4, 4, 4
    layers before it, not 3, 4, 5), and then the split nearest the even one (the fewest units
    moved), so that units of equal weight split evenly. Two exact passes over (stages,
    units): the least heaviest stage, then the best split under it."""
    n = len(weights)
    even = even_counts(n, stages)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    if prefix[-1] <= 0:
        return tuple(even)
    inf = float("inf")

    def ends(s: int) -> range:  # where stage s (0-based) may end: every later stage keeps a unit
        return range(s + 1, n - (stages - s - 1) + 1)

    # pass 1: least[s][i], the least heaviest stage of units [0, i) over s + 1 stages
    least = [[inf] * (n + 1) for _ in range(stages)]
    for i in ends(0):
        least[0][i] = prefix[i]
    for s in range(1, stages):
        for i in ends(s):
            least[s][i] = min(max(least[s - 1][j], prefix[i] - prefix[j]) for j in range(s, i))
    cap = least[stages - 1][n] * (1 + 1e-9) + 1e-12
    # pass 2: under that cap, the least (sum of squared stage weights, units away from the even
    # split); the squares in units of the total's, rounded, so that float noise ties
    scale = prefix[-1] ** 2

    def square(i: int, j: int) -> float:
        return (prefix[i] - prefix[j]) ** 2 / scale

    best = [[(inf, inf)] * (n + 1) for _ in range(stages)]
    back = [[0] * (n + 1) for _ in range(stages)]
    for i in ends(0):
        if prefix[i] <= cap:
            best[0][i] = (square(i, 0), abs(i - even[0]))
    for s in range(1, stages):
        for i in ends(s):
            for j in range(s, i):
                sq, moved = best[s - 1][j]
                if sq < inf and prefix[i] - prefix[j] <= cap:
                    key = (sq + square(i, j), moved + abs(i - j - even[s]))
                    if (round(key[0], 9), key[1]) < (round(best[s][i][0], 9), best[s][i][1]):
                        best[s][i], back[s][i] = key, j
    counts, i = [], n
    for s in range(stages - 1, 0, -1):
        j = back[s][i]
        counts.append(i - j)
        i = j
    counts.append(i)
    return tuple(reversed(counts))
