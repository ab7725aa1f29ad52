"""A split of a run's units that evens its stages by the run's own measured costs, for
``ppx plan --from-run``'s note: ``pipeline.balance=flops`` weighs units by their FLOPs, which
are not time where a layer's many small operations cost more than their FLOPs (a small
model, a CPU). Each run stage's measured F + B + W per microbatch is shared among its units
by their forward FLOPs (`PlanInputs.unit_weights`, else the split's own FLOPs, else equally),
and the units are split again (`ppx.models.split.balanced_counts`) so that the heaviest stage
is as light as any contiguous split makes it."""

from __future__ import annotations

from ppx.models.split import balanced_counts
from ppx.plan.inputs import PlanInputs

WORTH = 0.97  # a split whose heaviest stage is no lighter than this share of the run's is not named


def unit_times(inputs: PlanInputs) -> list[float] | None:
    """Seconds of F + B + W per microbatch of each model unit, by the run's measured stages;
    None without a run's units."""
    units = inputs.run_units
    if units is None or len(units) != len(inputs.fwd_s):
        return None
    n = sum(units)
    w = inputs.unit_weights.flops if inputs.unit_weights is not None else inputs.split_weights
    weights = list(w) if w is not None and len(w) == n else [1.0] * n
    out, start = [], 0
    for i, k in enumerate(units):
        cost = inputs.fwd_s[i] + inputs.bwd_s[i] + inputs.wgrad_s[i]
        mine = weights[start : start + k]
        total = sum(mine)
        out += [cost * x / total for x in mine] if total > 0 else [cost / k] * k
        start += k
    return out


def measured_split(inputs: PlanInputs) -> tuple[tuple[int, ...], float, float] | None:
    """(units per stage evening the run's measured stages, its heaviest stage's seconds a
    microbatch, the run's heaviest's), or None where there is no better split to name."""
    times = unit_times(inputs)
    if times is None or len(inputs.run_units) < 2:
        return None
    counts = balanced_counts(tuple(times), len(inputs.run_units))
    heaviest, start = 0.0, 0
    for k in counts:
        heaviest = max(heaviest, sum(times[start : start + k]))
        start += k
    ran = max(f + b + w for f, b, w in zip(inputs.fwd_s, inputs.bwd_s, inputs.wgrad_s))
    if tuple(counts) == tuple(inputs.run_units) or heaviest > WORTH * ran:
        return None
    return tuple(counts), heaviest, ran


def rebalance_note(source: str, inputs: PlanInputs) -> str | None:
    """The plan's note naming `measured_split`, or None."""
    got = measured_split(inputs)
    if got is None:
        return None
    counts, heaviest, ran = got
    listed = ",".join(map(str, counts))
    return (
        f"note: by {source}'s measured costs (each stage's F + B + W a microbatch, shared among its units by "
        f"their FLOPs), pipeline.layers_per_stage=[{listed}] evens its stages: the heaviest {heaviest * 1e3:.2f} ms "
        f"against {ran * 1e3:.2f} ms as it ran ({', '.join(map(str, inputs.run_units))} units); the candidates "
        "above split the units as the run's config does: measure this split beside it (run.paired)"
    )
