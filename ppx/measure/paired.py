"""What ``run.paired``'s steps say against the run's beside them (`ppx.engine.paired`): each
entry's step, the ratio of each of its steps to the run's step beside it, and whether their
losses agree (the same seed, data and optimizer: equal wherever the entry changes only how a
step is computed, as a schedule does). Where an entry is the run's own config (a *floor*,
`ppx.config.paired.floors`), every other entry is also held against it, step by step: two
copies of one config need not land at 1 against each other in one job (which goes first, and
whose instruments' records are kept, differ), and the floor is measured beside the run as
the others are."""

from __future__ import annotations

import math
import statistics

from ppx.measure.metrics import middle_half
from ppx.measure.prediction import input_freed_share, most_per_stage


def paired_step(records: list[dict]) -> list[tuple[float, float | None]]:
    """One step's records (every rank's, each with ``paired``: [start, end, loss, kept] per entry) ->
    per entry (its step time: the last rank's end minus the first rank's start, seconds; its
    loss, from the last stage)."""
    out = []
    for k in range(len(records[0]["paired"])):
        spans = [r["paired"][k] for r in records]
        loss = next((s[2] for s in spans if s[2] is not None), None)
        out.append((max(s[1] for s in spans) - min(s[0] for s in spans), loss))
    return out


MEMORY = ("saved_bytes_per_microbatch", "held_after_input_bytes")  # an entry's counters kept, per stage


def add_kept(records: list[dict], kept: list[dict]) -> list[bool | None]:
    """Adds what each entry kept of one step on every rank (`ppx.engine.paired.PairedSteps.kept`)
    to ``kept``, one dict per entry: ``action_s`` ("<stage><op>" -> seconds, every rank's),
    ``split_backward`` (stage -> how it ran its W), the memory counters' bytes per stage
    (the most of any step), and under fp16 ``optimizer_steps_skipped`` (steps whose
    optimizer step an overflow skipped: the ranks skip together). Returns, per entry, whether an
    overflow skipped its optimizer step in this step (`entry_skipped`)."""
    skips = []
    for k in range(len(records[0]["paired"])):
        if len(kept) <= k:
            kept.append({})
        skipped = entry_skipped(records, k)
        skips.append(skipped)
        if skipped is not None:
            kept[k]["optimizer_steps_skipped"] = kept[k].get("optimizer_steps_skipped", 0) + skipped
        for got in entry_kept(records, k):
            for key, seconds in (got.get("action_s") or {}).items():
                kept[k].setdefault("action_s", {}).setdefault(key, []).extend(seconds)
            if "split_backward" in got:
                kept[k].setdefault("split_backward", {}).update(got["split_backward"])
            for key in MEMORY:  # the most counted, per stage
                if got.get(key):
                    most_per_stage(kept[k].setdefault(key, {}), got[key])
    return skips


def entry_kept(records: list[dict], k: int) -> list[dict]:
    """What entry ``k`` kept of one step on each rank that kept anything (`PairedSteps.kept`)."""
    return [r["paired"][k][3] for r in records if len(r["paired"][k]) > 3 and r["paired"][k][3]]


def entry_skipped(records: list[dict], k: int) -> bool | None:
    """Whether an fp16 overflow skipped entry ``k``'s optimizer step in this step (on any rank:
    they skip together); None without loss scaling."""
    stepped = [got["optimizer_stepped"] for got in entry_kept(records, k) if "optimizer_stepped" in got]
    return not all(stepped) if stepped else None


def kept_fields(kept: dict) -> dict:
    """An entry's summary.json fields from what it kept (`add_kept`): ``cost_samples`` (its
    actions' seconds, rounded to 0.1 us as the run's own), ``split_backward`` and
    ``input_freed_share`` (per stage, as the run's own), in stage order; under fp16
    ``optimizer_steps_skipped``, as the run's own."""
    out = {k: kept[k] for k in ("optimizer_steps_skipped",) if k in kept}
    if kept.get("action_s"):
        out["cost_samples"] = {"action_s": {k: [round(x, 7) for x in v] for k, v in sorted(kept["action_s"].items())}}
    if kept.get("split_backward"):
        out["split_backward"] = dict(sorted(kept["split_backward"].items(), key=lambda kv: int(kv[0])))
    saved, held = kept.get("saved_bytes_per_microbatch"), kept.get("held_after_input_bytes") or {}
    if saved:  # per stage, as the run's own: the share of a microbatch's saved bytes its I frees
        n = max(int(s) for s in saved) + 1
        out["input_freed_share"] = [input_freed_share(saved.get(str(s), 0), held.get(str(s))) for s in range(n)]
    return out


def paired_summary(
    entries: list[str], run_times: list[float], run_losses: list, steps: list[list], floors: list[str] = ()
) -> dict:
    """Per entry: its median step (seconds), the median and middle half (inclusive quartiles,
    4 steps or more) of its steps over the run's beside them, the pairs, and how its losses
    compare with the run's (``losses_equal``: every step's bitwise; else the largest
    difference and the first step that differs). With ``floors`` (entries that are the run's
    own config), those say ``floor``, and every other entry's steps are held against the first
    floor's of the same step too (``over_floor``, its interval, and the floor it names)."""
    out = {}
    floor = next((entries.index(f) for f in floors if f in entries), None)
    for k, entry in enumerate(entries):
        times = [s[k][0] for s in steps]
        ratios = [t / r for t, r in zip(times, run_times) if r > 0]
        row = {"median_step_s": statistics.median(times), "over_run": statistics.median(ratios), "pairs": len(ratios)}
        half = middle_half(ratios)
        if half is not None:
            row["over_run_q1_q3"] = list(half)
        interval = median_interval(ratios)
        if interval is not None:
            row["over_run_ci95"] = list(interval)
        if entry in floors:
            row["floor"] = True
        elif floor is not None:
            against = [t / s[floor][0] for t, s in zip(times, steps) if s[floor][0] > 0]
            row.update(floor_entry=entries[floor], over_floor=statistics.median(against))
            interval = median_interval(against)
            if interval is not None:
                row["over_floor_ci95"] = list(interval)
        losses = [s[k][1] for s in steps]
        differ = [(i, abs(a - b)) for i, (a, b) in enumerate(zip(losses, run_losses)) if a != b and None not in (a, b)]
        row["losses_equal"] = not differ
        if differ:
            row["first_loss_difference_step"] = differ[0][0]
            row["max_loss_difference"] = max(d for _, d in differ)
        out[entry] = row
    return out


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free ``level`` confidence interval of the median of ``values``: the k-th
    smallest and k-th largest, k the largest whose binomial(n, 1/2) tail below it is at most
    (1 - level) / 2 (no assumption on how steps spread); None below 6 values, where no such k
    exists at 95%."""
    n = len(values)
    tail, k = 0.0, 0
    while k < n:
        tail += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2))
        if tail > (1 - level) / 2:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def ratio_span(lo: float, hi: float) -> str:
    """``lo-hi`` to 3 decimals; where the interval leaves 1 out but an end would read as 1, as
    many more (up to 6) as it takes not to (an interval under 1 by 0.00004 should not read as
    touching it)."""
    digits = 3
    while digits < 6 and (hi < 1 or lo > 1) and f"{1:.{digits}f}" in (f"{lo:.{digits}f}", f"{hi:.{digits}f}"):
        digits += 1
    return f"{lo:.{digits}f}-{hi:.{digits}f}"


def verdict(row: dict, against: str = "run") -> str:
    """Whether an entry's steps are told apart from the run's (``against="floor"``: from the
    floor's; ``"pooled"``: a pooled row of repeated jobs, `ppx.measure.paired_jobs`): its
    interval of the ratio (``over_<against>_ci95``) all below 1, all above, or holding 1."""
    if f"over_{against}_ci95" not in row:
        return "too few pairs to tell"
    lo, hi = row[f"over_{against}_ci95"]
    where = f"95% interval of the median {ratio_span(lo, hi)}"
    if row.get("floor") and (hi < 1 or lo > 1):  # the run's own config: what is off 1 is the job's, not a config's
        whose = "these jobs" if against == "pooled" else "this job"
        return f"off 1, a bias of {whose} ({where}): the others are held against it"
    if hi < 1:
        return f"faster ({where})"
    if lo > 1:
        return f"slower ({where})"
    return f"not told apart ({where})"


def said(row: dict, against: str = "run") -> str:
    """`verdict`'s word alone: faster, slower, not told apart, too few pairs to tell, or (a
    floor) off 1, a bias of this job (of these jobs, pooled)."""
    return verdict(row, against).split(" (")[0]


PAIRED_HEADER = [
    "entry",
    "step",
    "over the run's",
    "middle half",
    "95% interval",
    "verdict",
    "over the floor's",
    "losses",
]


def paired_rows(summary: dict) -> list[list[str]]:
    """report.html's table of ``summary.json``'s ``paired``: one row per entry."""
    rows = []
    for entry, row in summary.items():
        q = row.get("over_run_q1_q3")
        ci = row.get("over_run_ci95")
        losses = "equal" if row["losses_equal"] else f"differ from step {row['first_loss_difference_step']}"
        losses += unordered(row, "; {}") + skipped_steps(row, " ({})")
        floor = "(the floor: the run's own config)" if row.get("floor") else ""
        if "over_floor" in row:
            floor = f"{row['over_floor']:.3f}x: {verdict(row, 'floor')}"
        rows.append(
            [
                entry,
                f"{row['median_step_s'] * 1e3:.2f} ms",
                f"{row['over_run']:.3f}x ({row['pairs']} pairs)",
                f"{q[0]:.3f}-{q[1]:.3f}" if q else "",
                ratio_span(*ci) if ci else "",
                said(row),
                floor,
                losses,
            ]
        )
    return rows


def paired_lines(summary: dict) -> list[str]:
    """One line per entry, for the end of ``ppx run``."""
    out = []
    for entry, row in summary.items():
        spread = ""
        if "over_run_q1_q3" in row:
            q1, q3 = row["over_run_q1_q3"]
            spread = f", middle half {q1:.3f}-{q3:.3f}"
        losses = (
            "losses equal at every step"
            if row["losses_equal"]
            else f"losses differ from step {row['first_loss_difference_step']} (by up to {row['max_loss_difference']:.3g})"
        )
        losses += unordered(row, ": {}") + skipped_steps(row, "; {}")
        name = f"{entry!r} (the run's own config: the floor)" if row.get("floor") else repr(entry)
        floor = ""
        if "over_floor" in row:
            floor = f"; {row['over_floor']:.3f}x the floor's ({row['floor_entry']!r}): {verdict(row, 'floor')}"
        out.append(
            f"ppx: paired {name}: step {row['median_step_s']:.4f} s, {row['over_run']:.3f}x the run's step "
            f"beside it (median of {row['pairs']} pairs{spread}): {verdict(row)}{floor}; {losses}"
        )
    return out


def unordered(row: dict, form: str) -> str:
    """``form`` holding which list sums its microbatches out of microbatch order, where the
    losses differ (``sums_out_of_order``), or ""."""
    who = row.get("sums_out_of_order", [])
    if row["losses_equal"] or not who:
        return ""
    lists = "both lists sum" if len(who) == 2 else ("the run's list sums" if who == ["run"] else "its list sums")
    return form.format(f"{lists} the microbatches out of microbatch order: rounding, not a wrong gradient")


def skipped_steps(row: dict, form: str) -> str:
    """``form`` holding how many of an entry's optimizer steps an fp16 overflow skipped (its
    losses then part from the run's where the run's did not skip), or "" where none was."""
    n = row.get("optimizer_steps_skipped")
    return form.format(f"{n} optimizer step{'s' * (n != 1)} skipped on an fp16 overflow") if n else ""
