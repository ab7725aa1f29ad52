"""Bubble arithmetic: theory, and what the measured spans say.

Two normalisations, always named:
  ``bubble_fraction``   idle / step time       theory (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/p naive
  ``bubble_over_ideal`` idle / busy time       theory (p-1)/m for GPipe and 1F1B, p-1 naive
where busy = compute + communication (+ the data-parallel gradient reduction, dp_comm, when
parallel.data > 1: its own category, never idle), and idle = step time - busy (waiting for a peer
that has not sent yet, gaps between actions, the tail after a rank's last action).
Communication is posting plus transferring: the part of a wait after the peer posted the
matching send (the hand-off latency, measured across ranks on aligned clocks) is transfer,
not bubble; the part before it is the schedule's idle. (On NCCL a receive completes with its
coalesced batch, and batches run in order on one stream, so "transfer" there can include the
batch waiting on its other operations or behind the sender's earlier batches.)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from ppx.measure.spans import COMM, COMPUTE, DP_COMM, WAIT, Span, handoffs

# a rank's per-step fields: seconds and shares (medians over a run), and peaks (maxima);
# step_s is the rank's own timed step, from the common start to its last action's end
RANK_TIMES = (
    "step_s",
    "compute_s",
    "comm_s",
    "post_s",
    "transfer_s",
    "dp_comm_s",
    "wait_s",
    "idle_s",
    "bubble_fraction",
)
RANK_PEAKS = ("peak_inflight_microbatches", "peak_activation_bytes", "peak_memory_bytes")
PER_RANK = RANK_TIMES + RANK_PEAKS
RANK_SIZES = ("param_bytes",)  # fixed for a run (not scalars): the summary keeps the largest


def over_ideal(bubble_fraction: float | None) -> float | None:
    """Convert idle/step into idle/busy."""
    if bubble_fraction is None or bubble_fraction >= 1:
        return None
    return bubble_fraction / (1 - bubble_fraction)


def span_totals(spans: Iterable[Span]) -> dict:
    """Seconds per category from spans."""
    out = {COMPUTE: 0.0, COMM: 0.0, DP_COMM: 0.0, WAIT: 0.0}
    for sp in spans:
        out[sp.category] += sp.end_s - sp.start_s
    return out


def transfer_seconds(records: list[dict], stage_to_rank) -> dict[int, float]:
    """Per receiving rank: seconds of its waits that came after the peer posted the send."""
    spans = {r["rank"]: r["spans"] for r in records if r.get("spans") is not None}
    out = {rank: 0.0 for rank in spans}
    for h in handoffs(spans, stage_to_rank):
        out[h.peer] += max(h.wait_end_s - max(h.wait_start_s, h.posted_s), 0.0)
    return out


def step_breakdown(records: list[dict], stage_to_rank=None) -> dict:
    """Combine one step's per-rank records (aligned ``start``/``end`` seconds, category totals
    when timed, and the spans when ``stage_to_rank`` is given to split waits) into the step's
    metrics, filling in each rank's transfer, idle and bubble."""
    transfer = transfer_seconds(records, stage_to_rank) if stage_to_rank is not None else {}
    start = min(r["start"] for r in records)
    end = max(r["end"] for r in records)
    step_time = end - start
    timed = all(r.get("compute_s") is not None for r in records)
    ranks = []
    for r in sorted(records, key=lambda r: r["rank"]):
        row = {k: v for k, v in r.items() if k not in ("start", "end", "loss", "spans")}
        # this rank's own timed step (its ProfilerStep); step_time_s, from the first rank's start,
        # is the longest or a little more (a rank woken late from the common start: its idle)
        row["step_s"] = r["end"] - r["start"]
        if timed:
            row["post_s"] = r["comm_s"]
            row["transfer_s"] = transfer.get(r["rank"], 0.0)
            row["comm_s"] = row["post_s"] + row["transfer_s"]
            busy = r["compute_s"] + row["comm_s"] + (r.get("dp_comm_s") or 0.0)
            row["idle_s"] = max(step_time - busy, 0.0)
            row["bubble_fraction"] = row["idle_s"] / step_time if step_time > 0 else 0.0
        ranks.append(row)
    out = {"step_time_s": step_time, "ranks": ranks}
    if timed:
        out["bubble_fraction"] = sum(r["idle_s"] for r in ranks) / (len(ranks) * step_time) if step_time > 0 else 0.0
        out["bubble_over_ideal"] = over_ideal(out["bubble_fraction"])
    return out


def middle_half(values) -> tuple[float, float] | None:
    """(q1, q3) of ``values``, inclusive quartiles: their middle half; None below 4 values,
    where a range would be their extremes."""
    values = list(values)
    if len(values) < 4:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


NOISY = 0.15  # the middle half of a run's steps spanning more of their median: a busy machine (quiet: 5-7%)


def _steady_median(step_times) -> float | None:
    """The median of a run's steps (seconds) but its first (its set-up), or None under 5 steps
    (or a median of 0): what the spread and the stalls are held against."""
    steady = list(step_times)[1:]
    return (statistics.median(steady) or None) if len(steady) >= 4 else None


def steps_spread(step_times) -> tuple[float, tuple[float, float]] | None:
    """(how much of their median the middle half of a run's steps spans, that middle half in
    seconds) over ``step_times`` (seconds) with the first left out; None under 5 steps."""
    mid = _steady_median(step_times)
    if mid is None:
        return None
    q1, q3 = middle_half(list(step_times)[1:])
    return (q3 - q1) / mid, (q1, q3)


SLOW_STEP = 2.0  # a step over this many times the median step (the first left out): a stall of the machine


def stalled_steps(step_times) -> list[int]:
    """The steps (their indices) that took over `SLOW_STEP` times the median step, the first
    step left out of both (its set-up is no stall); none under 5 steps."""
    mid = _steady_median(step_times)
    return [] if mid is None else [k for k, t in enumerate(step_times) if k and t > SLOW_STEP * mid]


def noisy_note(what: str, step_times) -> str | None:
    """A note where ``what``'s steps spread widely (`steps_spread` over `NOISY`) or one took
    over `SLOW_STEP` times their median: its costs come from a busy machine or a drifting run,
    and so does every figure read from them (a plan from a llama-tiny run whose steps spread
    35% ranked ZB-H2 first at 0.91x 1F1B's step, its jobs measured 1.02x; one stalled step of
    six made a zbv run predict 66.7 ms against a 13.3 ms median step). None for a quiet run or
    fewer than 5 steps."""
    got = steps_spread(step_times)
    if got is None:
        return None
    spread, (q1, q3) = got
    mid = _steady_median(step_times)
    slow = [(k, step_times[k]) for k in stalled_steps(step_times)]
    said = []
    if spread > NOISY:
        said.append(
            f"the middle half of them spans {spread:.0%} of their median, {q1 * 1e3:.1f}-{q3 * 1e3:.1f} ms; "
            f"a quiet run spreads well under {NOISY:.0%}"
        )
    if slow:
        steps = ", ".join(f"step {k} {t * 1e3:.1f} ms" for k, t in slow[:3]) + (", ..." if len(slow) > 3 else "")
        said.append(f"{steps} against a median of {mid * 1e3:.1f} ms, a stall")
    if not said:
        return None
    if spread <= NOISY:  # (stalls alone: a prediction leaves their steps out, its other figures do not)
        return (
            f"note: {what}'s steps spread widely ({'; '.join(said)}): a busy machine; its median step and bubble "
            "hold them, though a prediction from its costs leaves their steps out; run it again on a quiet machine"
        )
    return (
        f"note: {what}'s steps spread widely ({'; '.join(said)}): its costs come from a busy machine or a "
        "drifting run, and so does every figure read from them; run it again on a quiet machine"
    )


def run_summary(steps: list[dict]) -> dict:
    """Medians over steps (max for peaks, over the steps that have them) of the per-step metrics."""
    med = statistics.median
    out = {"step_time_s": med(s["step_time_s"] for s in steps)}
    if "bubble_fraction" in steps[0]:
        out["bubble_fraction"] = med(s["bubble_fraction"] for s in steps)
        # each its own median (of an even count the middle two's mean, which over_ideal does not
        # keep); a step all idle (None: no busy time) counts as the largest
        ratios = [math.inf if s["bubble_over_ideal"] is None else s["bubble_over_ideal"] for s in steps]
        ratio = med(ratios)
        out["bubble_over_ideal"] = ratio if math.isfinite(ratio) else None
    ranks = []
    for r, first in enumerate(steps[0]["ranks"]):
        rows = [s["ranks"][r] for s in steps]
        row = {"rank": first["rank"]}
        for key in RANK_TIMES:
            if first.get(key) is not None:
                row[key] = med(x[key] for x in rows)
        for key in RANK_PEAKS + RANK_SIZES:  # over the steps that measured it (saved bytes: instrument.memory_steps)
            got = [x[key] for x in rows if x.get(key) is not None]
            if got:
                row[key] = max(got)
        ranks.append(row)
    out["ranks"] = ranks
    return out
