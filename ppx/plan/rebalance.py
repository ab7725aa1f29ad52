"""A split of a run's units that evens its stages by the run's own measured costs, for
``ppx plan --from-run``'s note: ``pipeline.balance=flops`` weighs units by their FLOPs, which
are not time where a layer's many small operations cost more than their FLOPs (a small
model, a CPU). Each run stage's measured F + B + W per microbatch is shared among its units
by their forward FLOPs (`PlanInputs.unit_weights`, else the split's own FLOPs, else equally),
and the units are split again (`ppx.models.split.balanced_counts`) so that the heaviest stage
is as light as any contiguous split makes it."""

from __future__ import annotations

from ppx.models.split import balanced_counts, split_layers
from ppx.plan.inputs import PlanInputs

WORTH = 0.97  # a split whose heaviest stage is no lighter than this share of the run's is not named


def unit_times(inputs: PlanInputs, flops=None) -> list[float] | None:
    """Seconds of F + B + W per microbatch of each model unit, by the run's measured stages,
    shared by the units' FLOPs (the plan's unit weights, else ``flops``, else equally); None
    without a run's units."""
    units = inputs.run_units
    if units is None or len(units) != len(inputs.fwd_s):
        return None
    n = sum(units)
    w = inputs.unit_weights.flops if inputs.unit_weights is not None else flops
    weights = list(w) if w is not None and len(w) == n else [1.0] * n
    out = []
    for i, r in enumerate(split_layers(n, len(units), units)):
        cost = inputs.fwd_s[i] + inputs.bwd_s[i] + inputs.wgrad_s[i]
        mine = weights[r.start : r.stop]
        total = sum(mine)
        out += [cost * x / total for x in mine] if total > 0 else [cost / len(r)] * len(r)
    return out


def measured_split(inputs: PlanInputs, flops=None) -> tuple[tuple[int, ...], float, float] | None:
    """(units per stage evening the run's measured stages, its heaviest stage's seconds a
    microbatch, the run's heaviest's), or None where there is no better split to name."""
    times = unit_times(inputs, flops)
    if times is None or len(inputs.run_units) < 2:
        return None
    # a unit handing on integers stays with the next (no stage begins after it): split the groups
    groups = [1]
    for u in range(1, len(times)):
        if u - 1 in inputs.no_cut_after:
            groups[-1] += 1
        else:
            groups.append(1)
    if len(groups) < len(inputs.run_units):
        return None
    starts = [sum(groups[:g]) for g in range(len(groups))]
    glued = balanced_counts(tuple(sum(times[a : a + k]) for a, k in zip(starts, groups)), len(inputs.run_units))
    counts = [sum(groups[g] for g in r) for r in split_layers(len(groups), len(glued), glued)]
    heaviest = max(sum(times[r.start : r.stop]) for r in split_layers(len(times), len(counts), counts))
    ran = max(f + b + w for f, b, w in zip(inputs.fwd_s, inputs.bwd_s, inputs.wgrad_s))
    if tuple(counts) == tuple(inputs.run_units) or heaviest > WORTH * ran:
        return None
    return tuple(counts), heaviest, ran


def rebalance_note(source: str, inputs: PlanInputs, cfg) -> str | None:
    """The plan's note naming `measured_split` for the run config ``cfg``, or None: none for
    the known-cost model (its per-layer costs are its config's, to set, not to split again),
    nor where a rank holds several stages (evening stages would not even ranks)."""
    from ppx import models
    from ppx.config.resolve import resolve_schedule

    if cfg.model.kind == "synthetic":
        return None
    sched = resolve_schedule(cfg)
    if sched.num_stages != sched.num_ranks:
        return None
    flops = models.counted_flops(cfg.model)  # (None for a module that does not import here: equal shares)
    got = measured_split(inputs, flops)
    if got is None:
        return None
    counts, heaviest, ran = got
    shared = "their FLOPs" if inputs.unit_weights is not None or flops is not None else "equal shares"
    split = _as_keys(cfg, counts)
    beside = cfg.parallel.data == 1 and not (cfg.model.kind == "module" and cfg.model.split_points)
    how = (
        "measure it beside the run (run.paired)"
        if beside
        else "run it and hold the two runs side by side (ppx compare)"
    )
    return (
        f"note: by {source}'s measured costs (each stage's F + B + W a microbatch, shared among its units by "
        f"{shared}), {split} evens its stages: the heaviest {heaviest * 1e3:.2f} ms against {ran * 1e3:.2f} ms "
        f"as it ran ({', '.join(map(str, inputs.run_units))} units); the candidates above split the units as the "
        f"run's config does: {how}"
    )


def _as_keys(cfg, counts: tuple[int, ...]) -> str:
    """The split ``counts`` as the run gives its own: model.split_points (a module's units where
    stages begin) or pipeline.layers_per_stage."""
    if cfg.model.kind == "module" and cfg.model.split_points:
        from ppx.models import module_spec

        try:
            _, names = module_spec.described(cfg.model)
        except Exception:
            names = None
        if names is not None and len(names) == sum(counts):
            starts = [sum(counts[:k]) for k in range(1, len(counts))]
            return f"model.split_points=[{','.join(names[i] for i in starts)}]"
    return f"pipeline.layers_per_stage=[{','.join(map(str, counts))}]"
