"""`ppx compare`'s notes under its table, on what the table cannot order: runs of one config
apart (the machine's run-to-run noise), runs whose middle halves of steps overlap, each run's
``run.paired`` entries against it, and repeated paired jobs of one config pooled
(`ppx.measure.paired_jobs`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from ppx.errors import UserError
from ppx.measure.paired import paired_step, paired_summary, ratio_span, said
from ppx.measure.paired_jobs import pooled_rows
from ppx.report.labels import timing_key
from ppx.report.run_dir import RunDir


def noise_notes(rows: list[dict], configs: list[dict]) -> list[str]:
    """Notes on what the table cannot order: runs of one config (`timing_key`) whose median
    steps differ (the machine's run-to-run noise, which a run's own steps do not show), and runs
    of one model, batch and p whose middle halves of steps overlap."""
    names = [_short(r) for r in rows]
    out = []
    same: dict[str, list[int]] = {}
    for k, c in enumerate(configs):
        key = timing_key(c)
        if key is not None and rows[k]["step_ms"] > 0:
            same.setdefault(key, []).append(k)
    groups = [g for g in same.values() if len(g) > 1]
    if groups:
        g = max(groups, key=lambda g: _spread(rows, g))
        out.append(
            f"note: {_listed([names[k] for k in g])} ran one config, and their median steps differ by "
            f"{_spread(rows, g):.0%}: this machine's run-to-run noise here, which no run's own steps show; a "
            "difference between other runs smaller than that orders nothing"
        )
    group_of = {k: i for i, g in enumerate(groups) for k in g}
    kin = [tuple(c.get(x) for x in ("model.kind", "train.batch_size", "pipeline.stages")) for c in configs]
    spans = [(k, tuple(map(float, r["step_range"].split("-")))) for k, r in enumerate(rows) if r.get("step_range")]
    pairs = [
        (names[a], names[b])
        for i, (a, x) in enumerate(spans)
        for b, y in spans[i + 1 :]
        if kin[a] == kin[b]
        and (a not in group_of or group_of.get(a) != group_of.get(b))
        and x[0] <= y[1]
        and y[0] <= x[1]
    ]
    if pairs:
        out.append(
            f"note: the middle halves of the steps of {_listed([f'{a} and {b}' for a, b in pairs], '; ')} overlap: "
            "their median steps differ by less than their own steps spread; repeat them, alternated (a sweep runs "
            "its points one after another), before ranking them"
        )
    return out


def paired_notes(runs: list[RunDir], rows: list[dict]) -> list[str]:
    """A note per run that ran configs beside it (``run.paired``): each entry's median step over
    the run's, its verdict, and against the floor where the run had one (`ppx.measure.paired`)."""
    out = []
    for run, row in zip(runs, rows):
        paired = job_paired(run)
        parts = []
        for entry, p in paired.items():
            if p.get("floor"):
                parts.append(f"{entry!r} (its own config, the floor) {p['over_run']:.3f}x ({said(p)})")
                continue
            floor = f"; {p['over_floor']:.3f}x the floor's, {said(p, 'floor')}" if "over_floor" in p else ""
            parts.append(f"{entry!r} {p['over_run']:.3f}x ({said(p)}{floor})")
        if parts:
            pairs = max(p["pairs"] for p in paired.values())
            what = "each config's median step over its step"
            out.append(f"note: beside {_short(row)} (run.paired, {pairs} pairs), {what}: {'; '.join(parts)}")
    return out


def _short(row: dict) -> str:
    """A run's name in a note: its label where short, else its folder's name."""
    label = row.get("label") or ""
    return label if 0 < len(label) <= 40 else Path(row["name"]).name


def _listed(items: list[str], sep: str = " and ", most: int = 4) -> str:
    return sep.join(items[:most]) + (f"{sep}{len(items) - most} more" if len(items) > most else "")


def _spread(rows: list[dict], group: list[int]) -> float:
    """(largest - smallest) / smallest median step among the runs ``group`` names."""
    steps = [rows[k]["step_ms"] for k in group]
    return (max(steps) - min(steps)) / min(steps)


def job_paired(run: RunDir) -> dict:
    """A run's ``run.paired`` rows (`paired_summary`), recomputed from its metrics.jsonl with
    its config's floors, so that a run made before ppx marked floors names its own; its
    summary.json's rows where its files cannot be read so."""
    stored = run.raw_summary.get("paired") or {}
    if not stored:
        return {}
    try:
        from ppx.config.paired import floors

        cfg = run.config
        lines = run.metrics
        steps = [_paired_step(line) for line in lines]
        times, losses = [line["step_time_s"] for line in lines], [line["loss"] for line in lines]
        rows = paired_summary(list(cfg.run.paired), times, losses, steps, floors(cfg))
    except (UserError, OmegaConfBaseException, KeyError, TypeError, ValueError):
        return stored
    return rows if list(rows) == list(stored) else stored


def _paired_step(line: dict) -> list[tuple]:
    """A metrics.jsonl step's (step time, loss) per entry: its own ``paired`` field, or from its
    ranks' records in runs made before that field."""
    if "paired" in line:
        return [(e["step_time_s"], e["loss"]) for e in line["paired"]]
    return paired_step(line["ranks"])


def pooled_notes(runs: list[RunDir], rows: list[dict], configs: list[dict]) -> list[str]:
    """A note per group of two or more runs of one config (`timing_key`) and one ``run.paired``
    list: each entry's ratio per job and pooled across the jobs (`pooled_rows`), with its
    verdict, and which entries' jobs differ by more than one job's interval."""
    groups: dict[tuple, list[int]] = {}
    for k, (run, c) in enumerate(zip(runs, configs)):
        key = timing_key(c)
        if key is not None and c.get("run.paired") and run.raw_summary.get("paired"):
            groups.setdefault((key, repr(c["run.paired"])), []).append(k)
    out = []
    for group in (g for g in groups.values() if len(g) > 1):
        pooled = pooled_rows([job_paired(runs[k]) for k in group])
        parts, differ = [], []
        for entry, p in pooled.items():
            each = ", ".join(f"{x:.3f}" for x in p["per_job"])
            against = "the run's" if p["against"] == "run" else "the floor's"
            if "over_pooled" not in p:
                parts.append(f"{entry!r} over {against} {each}")
                continue
            lo, hi = p["over_pooled_ci95"]
            what = "the floor, over the run's" if p.get("floor") else f"over {against}"
            word = "off 1 across jobs: a bias of how the jobs pair" if p.get("floor") else said(p, "pooled")
            if p.get("floor") and lo <= 1 <= hi:
                word = "level with the run"
            parts.append(f"{entry!r} ({what}) {each}: pooled {p['over_pooled']:.3f}x ({ratio_span(lo, hi)}), {word}")
            if p["jobs_differ"]:
                differ.append(repr(entry))
        names = _listed([_short(rows[k]) for k in group], ", ", most=6)
        note = (
            f"note: {len(group)} jobs of one config and run.paired ({names}), each entry's median ratio per job "
            f"and pooled across jobs (geometric mean, 95% Student-t interval over jobs): {'; '.join(parts)}"
        )
        if differ:
            note += (
                f"; the jobs of {_listed(differ, ', ', most=6)} differ by more than one job's own interval: "
                "one job's verdict is not the config's"
            )
        out.append(note)
    return out
