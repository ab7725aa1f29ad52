"""`ppx compare`'s notes under its table, on what the table cannot order: runs of one config
apart (the machine's run-to-run noise), runs whose middle halves of steps overlap, each run's
``run.paired`` entries against it, and repeated paired jobs of one config pooled
(`ppx.measure.paired_jobs`)."""

from __future__ import annotations

from pathlib import Path

from ppx.measure.paired import paired_step, paired_summary, ratio_span, said
from ppx.measure.paired_jobs import pooled_rows
from ppx.report.labels import timing_key
from ppx.report.run_dir import RunDir


def noise_notes(rows: list[dict], configs: list[dict]) -> list[str]:
    """Notes on what the table cannot order: runs of one config (`timing_key`) whose median
    steps differ (the machine's run-to-run noise, which a run's own steps do not show), or,
    where no config ran twice, that the table holds no such noise (runs of one model, batch
    and p, each once); and runs of one model, batch and p whose middle halves of steps overlap."""
    names = note_names(rows)
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
            f"note: {listed([names[k] for k in g])} ran one config, and their median steps differ by "
            f"{_spread(rows, g):.0%}: this machine's run-to-run noise here, which no run's own steps show; a "
            "difference between other runs smaller than that orders nothing"
        )
    group_of = {k: i for i, g in enumerate(groups) for k in g}
    kin = [tuple(c.get(x) for x in ("model.kind", "train.batch_size", "pipeline.stages")) for c in configs]
    timed = [kin[k] for g in same.values() for k in g]
    if not groups and len(timed) > len(set(timed)):
        out.append(
            "note: each config ran once, so this table holds none of this machine's run-to-run noise, which no "
            "run's own steps show; ppx sweep --repeat N runs each config again, and run.paired runs configs "
            "step by step beside each other, before a difference of a few % ranks them"
        )
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
            f"note: the middle halves of the steps of {listed([f'{a} and {b}' for a, b in pairs], '; ', last='; ')} overlap: "
            "their median steps differ by less than their own steps spread; hold them step by step beside each "
            "other (run.paired), in repeated jobs (ppx sweep --repeat), before ranking them"
        )
    return out


def paired_notes(paired: list[dict], names: list[str]) -> list[str]:
    """A note per run that ran configs beside it (``paired``: each run's `job_paired` rows, empty
    for a run whose jobs are pooled: `pooled_notes` gives each job's ratio there): each entry's
    median ratio to the floor's step beside it where the run had a floor, then to the run's,
    with their verdicts (`ppx.measure.paired`)."""
    out = []
    for rows, name in zip(paired, names):
        parts = []
        for entry, p in rows.items():
            if p.get("floor"):
                parts.append(f"{entry!r} (the run's own config: the floor) {p['over_run']:.3f}x the run's ({said(p)})")
                continue
            floor = f"{p['over_floor']:.3f}x the floor's ({said(p, 'floor')}), " if "over_floor" in p else ""
            parts.append(f"{entry!r} {floor}{p['over_run']:.3f}x the run's ({said(p)})")
        if parts:
            pairs = max(p["pairs"] for p in rows.values())
            what = "each entry's median ratio of its step to the step beside it"
            out.append(f"note: beside {name} (run.paired, {pairs} pairs), {what}: {'; '.join(parts)}")
    return out


def note_names(rows: list[dict]) -> list[str]:
    """Each run's name in a note: its label where short, else its folder's name; where two runs
    would be called the same (runs of two sweeps: repeat=1 in each), every run by the fewest
    last parts of its path that tell them all apart (sweep-<time>/repeat=1)."""
    short = [_short(r) for r in rows]
    if len(set(short)) == len(short):
        return short
    parts = [Path(r["name"]).parts for r in rows]
    for k in range(1, max(map(len, parts)) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [r["name"] for r in rows]


def _short(row: dict) -> str:
    """A run's name in a note: its label where short, else its folder's name."""
    label = row.get("label") or ""
    return label if 0 < len(label) <= 40 else Path(row["name"]).name


def listed(items: list[str], sep: str = ", ", most: int = 4, last: str = " and ") -> str:
    """``a, b and c``; past ``most`` items, ``a, b, c, d and 2 more`` (``sep`` between all but
    the last two, ``last`` between those)."""
    shown = items[:most] + ([f"{len(items) - most} more"] if len(items) > most else [])
    return shown[0] if len(shown) == 1 else sep.join(shown[:-1]) + last + shown[-1]


def _spread(rows: list[dict], group: list[int]) -> float:
    """(largest - smallest) / smallest median step among the runs ``group`` names."""
    steps = [rows[k]["step_ms"] for k in group]
    return (max(steps) - min(steps)) / min(steps)


def job_paired(run: RunDir) -> dict:
    """A run's ``run.paired`` rows as its summary.json has them; for a run made before ppx
    marked floors (no row is one, but its config names one: `floors`), recomputed from its
    metrics.jsonl with those floors where its files read back whole (every entry with as many
    pairs as its summary counted), so that it names its floor too."""
    stored = run.raw_summary.get("paired") or {}
    if not stored or any(row.get("floor") for row in stored.values()):
        return stored
    try:
        from ppx.config.paired import floors

        cfg = run.config
        found = floors(cfg)
        if not found:
            return stored
        lines = run.metrics
        steps = [_entries_of(line) for line in lines]
        times, losses = [line["step_time_s"] for line in lines], [line["loss"] for line in lines]
        rows = paired_summary(list(cfg.run.paired), times, losses, steps, found)
    except Exception:  # a file this ppx cannot read back (another schema, cut short): the summary's rows
        return stored
    if list(rows) != list(stored) or any(rows[e]["pairs"] != stored[e].get("pairs") for e in rows):
        return stored
    return {e: {**stored[e], **row} for e, row in rows.items()}  # (what only the summary has: each entry's split)


def _entries_of(line: dict) -> list[tuple]:
    """A metrics.jsonl step's (step time, loss) per entry: its own ``paired`` field, or from its
    ranks' records in runs made before that field."""
    if "paired" in line:
        return [(e["step_time_s"], e["loss"]) for e in line["paired"]]
    return paired_step(line["ranks"])


def pooled_groups(paired: list[dict], configs: list[dict]) -> list[tuple[list[int], dict]]:
    """(the runs' indices, `pooled_rows`) per group of two or more runs of one config
    (`timing_key`) and one ``run.paired`` list (``paired``: each run's `job_paired` rows)."""
    groups: dict[tuple, list[int]] = {}
    for k, (rows, c) in enumerate(zip(paired, configs)):
        key = timing_key(c)
        if key is not None and c.get("run.paired") and rows:
            groups.setdefault((key, repr(c["run.paired"])), []).append(k)
    return [(g, pooled_rows([paired[k] for k in g])) for g in groups.values() if len(g) > 1]


def pooled_word(row: dict) -> str:
    """A pooled entry's verdict: faster, slower, not told apart (the floor: not told apart
    from the run, or off 1, a bias of these jobs)."""
    return said(row, "pooled")


def pooled_notes(groups: list[tuple[list[int], dict]], names: list[str], commits: list[str | None]) -> list[str]:
    """A note per `pooled_groups` group: each entry's ratio per job (in the order the jobs are
    named) and pooled across the jobs, with its verdict; which entries have two jobs whose own
    intervals do not overlap; jobs held against the run's because some had no floor; and the
    ppx commits (``commits``: each run's, env.json's) where the jobs were made by more than one."""
    out = []
    for group, pooled in groups:
        parts, differ = [], []
        for entry, p in pooled.items():
            each = ", ".join(f"{x:.3f}" for x in p["per_job"])
            what = "the run's own config: the floor, over the run's" if p.get("floor") else f"over the {p['against']}'s"
            if p.get("floorless_jobs"):
                what += f": {p['floorless_jobs']} of the jobs name no floor"
            if "over_pooled" not in p:
                parts.append(f"{entry!r} ({what}) {each}")
                continue
            span = ratio_span(*p["over_pooled_ci95"])
            parts.append(f"{entry!r} ({what}) {each}: pooled {p['over_pooled']:.3f}x ({span}), {pooled_word(p)}")
            if p["jobs_differ"]:
                differ.append(repr(entry))
        note = (
            f"note: {len(group)} jobs of one config and run.paired ({', '.join(names[k] for k in group)}), each "
            "entry's median ratio per job and pooled across jobs (geometric mean, 95% Student-t interval over "
            f"jobs): {'; '.join(parts)}"
        )
        if differ:
            note += (
                f"; {listed(differ, most=6)}: two jobs' own intervals do not overlap, so jobs differ by more "
                "than one job's interval says: one job's verdict is not the config's"
            )
        made = sorted({commits[k][:7] for k in group if commits[k]})
        if len(made) > 1:
            note += (
                f"; the jobs were made by {len(made)} ppx commits ({', '.join(made)}): a change between them pools too"
            )
        out.append(note)
    return out


POOLED_HEADER = ["entry", "over", "jobs", "each job", "pooled", "95% interval over jobs", "verdict"]


def pooled_table(pooled: dict) -> list[list[str]]:
    """One `pooled_groups` group's entries as rows under `POOLED_HEADER` (compare.md and the
    comparison's report.html)."""
    rows = []
    for entry, p in pooled.items():
        ci = p.get("over_pooled_ci95")
        rows.append(
            [
                entry + (" (the floor)" if p.get("floor") else ""),
                f"the {p['against']}'s",
                str(p["jobs"]),
                ", ".join(f"{x:.3f}" for x in p["per_job"]),
                f"{p['over_pooled']:.3f}x" if "over_pooled" in p else "",
                ratio_span(*ci) if ci else "",
                pooled_word(p) if ci else "",
            ]
        )
    return rows


def pooled_json(paired: list[dict], groups: list[tuple[list[int], dict]], names: list[str]) -> dict:
    """compare's paired.json: each paired run's rows by its name, and each pooled group (its
    runs, and per entry its pooled row with its verdict)."""
    return {
        "runs": {name: rows for name, rows in zip(names, paired) if rows},
        "pooled": [
            {
                "runs": [names[k] for k in group],
                "entries": {e: {**row, "verdict": pooled_word(row)} for e, row in pooled.items()},
            }
            for group, pooled in groups
        ],
    }
