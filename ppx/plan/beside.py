"""What the run a plan reads measured of the plan's own candidates: the run's own config, and
each of its ``run.paired`` entries that runs a candidate as planned, measured step by step
beside one another in that run (the same work in the same order: `ppx.config.paired.same_work`,
so a list matches a CSV of its compute order wherever each places its sends). The plan's note holds each
one's measured ratio over the run's step against the ratio the plan predicts for it, so that a
plan says where it and the run that fed it disagree (a plan from one noisy run is a
prediction, docs/plan.md)."""

from __future__ import annotations

from ppx.errors import UserError


def beside_note(run_path: str, results, overrides: list[list[str]], run_cfg, experiment: str, rows: dict) -> str | None:
    """The note, or None where the run measured no candidate but its own (or is not one).
    ``results`` and ``overrides``: the plan's candidates and the `ppx run` overrides that run
    each as planned; ``rows``: the run's summary.json ``paired`` rows."""
    from omegaconf.errors import OmegaConfBaseException

    from ppx import config
    from ppx.config.paired import same_work, variants
    from ppx.config.resolve import resolve_schedule

    unreadable = (UserError, OmegaConfBaseException, OSError, ValueError)  # (a CSV moved since the run)
    if not rows:
        return None
    try:
        # (a floor is the run's own config: its ratio is the job's, not a candidate's)
        entries = [(e, cfg) for e, cfg in variants(run_cfg) if _measured(rows.get(e))]
        shape = (resolve_schedule(run_cfg).num_ranks, run_cfg.pipeline.microbatches)
    except unreadable:
        return None
    alone, own, found = _with(run_cfg), None, []
    for r, keys in zip(results, overrides):
        if (r.p, r.m) != shape:  # (an entry shares the run's p and m)
            continue
        try:
            cand = _with(run_cfg, config.load(experiment, [*keys, "run.paired=[]", "run.dir=null"]))
            if own is None and same_work(cand, alone):
                own = r
            entry = next((e for e, cfg in entries if same_work(cand, cfg)), None)
        except unreadable:  # (this candidate's command does not load: the others still may)
            continue
        if entry is not None and all(entry != e for _, e in found):
            found.append((r, entry))
    if own is None or not found:
        return None
    parts = []
    for r, entry in found:
        row = rows[entry]
        ci = row.get("over_run_ci95")
        interval = f" (95% interval of the median {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""
        parts.append(
            f"{r.schedule} ({entry!r}) measured {row['over_run']:.3f}x{interval}, predicted {r.step_s / own.step_s:.3f}x"
        )
    return (
        f"note: {run_path} ran candidates beside its own config ({own.schedule}), step by step; each one's step "
        "over the run's beside it: " + "; ".join(parts)
    )


def _measured(row) -> bool:
    """Whether a paired row holds a ratio over the run's, and is not the run's own config."""
    return bool(row) and row.get("over_run") is not None and not row.get("floor")


def _with(run_cfg, cand=None):
    """The run's config without its run.paired entries and fault (as an entry's config has it), with
    ``cand``'s sections that an entry may change (``pipeline``, ``model``, ``train``) where given."""
    import copy

    out = copy.deepcopy(run_cfg)
    out.run.paired, out.runtime.inject_fault = [], None
    if cand is not None:
        out.pipeline, out.model, out.train = cand.pipeline, cand.model, cand.train
    return out
