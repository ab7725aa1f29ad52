"""Bubble arithmetic: theory, and what the measured spans say.

Two normalisations, always named:
  ``bubble_fraction``   idle / step time       theory (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/p naive
  ``bubble_over_ideal`` idle / busy time       theory (p-1)/m for GPipe and 1F1B, p-1 naive
where busy = compute + communication posting and idle = step time - busy (waiting on
peers, gaps between actions, and the tail after a rank's last action).
"""

from __future__ import annotations

import statistics
from typing import Iterable, Optional

COMPUTE, COMM, WAIT = "compute", "comm", "wait"
CATEGORY = {"compute": COMPUTE, "post": COMM, "wait": WAIT, "drain": WAIT}


def over_ideal(bubble_fraction: Optional[float]) -> Optional[float]:
    """Convert idle/step into idle/busy."""
    if bubble_fraction is None or bubble_fraction >= 1:
        return None
    return bubble_fraction / (1 - bubble_fraction)


def span_totals(spans: Iterable) -> dict:
    """Seconds per category from (item, start, end) spans."""
    out = {COMPUTE: 0.0, COMM: 0.0, WAIT: 0.0}
    for item, start, end in spans:
        out[CATEGORY[item.kind]] += end - start
    return out


def step_breakdown(records: list[dict]) -> dict:
    """Combine one step's per-rank records (aligned ``start``/``end`` seconds, and category
    totals when timed) into the step's metrics, filling in each rank's idle and bubble."""
    start = min(r["start"] for r in records)
    end = max(r["end"] for r in records)
    step_time = end - start
    timed = all(r.get("compute_s") is not None for r in records)
    ranks = []
    for r in sorted(records, key=lambda r: r["rank"]):
        row = {k: v for k, v in r.items() if k not in ("start", "end", "loss", "spans")}
        if timed:
            busy = r["compute_s"] + r["comm_s"]
            row["idle_s"] = max(step_time - busy, 0.0)
            row["bubble_fraction"] = row["idle_s"] / step_time if step_time > 0 else 0.0
        ranks.append(row)
    out = {"step_time_s": step_time, "ranks": ranks}
    if timed:
        out["bubble_fraction"] = sum(r["idle_s"] for r in ranks) / (len(ranks) * step_time) if step_time > 0 else 0.0
        out["bubble_over_ideal"] = over_ideal(out["bubble_fraction"])
    return out


def run_summary(steps: list[dict]) -> dict:
    """Medians over steps (max for peaks) of the per-step metrics."""
    med = statistics.median
    out = {"step_time_s": med(s["step_time_s"] for s in steps)}
    if "bubble_fraction" in steps[0]:
        out["bubble_fraction"] = med(s["bubble_fraction"] for s in steps)
        out["bubble_over_ideal"] = over_ideal(out["bubble_fraction"])
    ranks = []
    for r, first in enumerate(steps[0]["ranks"]):
        rows = [s["ranks"][r] for s in steps]
        row = {"rank": first["rank"]}
        for key in ("compute_s", "comm_s", "wait_s", "idle_s", "bubble_fraction"):
            if first.get(key) is not None:
                row[key] = med(x[key] for x in rows)
        for key in ("peak_inflight_microbatches", "peak_activation_bytes", "peak_memory_bytes"):
            if first.get(key) is not None:
                row[key] = max(x[key] for x in rows)
        ranks.append(row)
    out["ranks"] = ranks
    return out
