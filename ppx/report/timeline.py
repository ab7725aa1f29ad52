"""The measured timeline as a Chrome/Perfetto trace: one track per rank, rank clocks aligned
to rank 0's, a slice per program item, and a flow arrow from each send to the wait that
receives it. Open ``<run>/timeline.json`` in ui.perfetto.dev or chrome://tracing.

Input spans are `ppx.measure.spans.Span`s per rank and step, with times on rank 0's clock.
"""

from __future__ import annotations

from ppx.measure.spans import handoffs


def chrome_trace(steps: list[dict], stage_to_rank, title: str = "") -> dict:
    """``steps`` = [{"step": k, "ranks": {rank: [Span, ...]}}] -> Chrome trace JSON (dict)."""
    all_starts = [sp.start_s for s in steps for spans in s["ranks"].values() for sp in spans]
    origin = min(all_starts) if all_starts else 0.0
    us = lambda t: round((t - origin) * 1e6, 3)  # noqa: E731
    ranks = sorted({r for s in steps for r in s["ranks"]})
    events: list[dict] = []
    for r in ranks:
        stages = [s for s, owner in enumerate(stage_to_rank) if owner == r]
        name = f"rank {r} (stage{'s' if len(stages) > 1 else ''} {','.join(map(str, stages))})"
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 0, "args": {"name": "pipeline"}})
    flow_id = 0
    for s in steps:
        for r, spans in s["ranks"].items():
            for sp in spans:
                events.append(
                    {
                        "ph": "X",
                        "name": sp.label,
                        "cat": sp.category,
                        "pid": r,
                        "tid": 0,
                        "ts": us(sp.start_s),
                        "dur": round((sp.end_s - sp.start_s) * 1e6, 3),
                        "args": {"step": s["step"], "rank": r},
                    }
                )
        for h in handoffs(s["ranks"], stage_to_rank):
            flow_id += 1
            arrive = max(h.wait_start_s, h.wait_end_s - 1e-6)  # inside the wait slice, so the arrow binds to it
            name = str(h.send)
            events.append(
                {"ph": "s", "id": flow_id, "name": name, "cat": "p2p", "pid": h.rank, "tid": 0, "ts": us(h.posted_s)}
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "id": flow_id,
                    "name": name,
                    "cat": "p2p",
                    "pid": h.peer,
                    "tid": 0,
                    "ts": us(arrive),
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "clock": "rank 0 perf_counter"},
    }
