"""The measured timeline as a Chrome/Perfetto trace: one track per rank, rank clocks aligned
to rank 0's, a slice per program item, and a flow arrow from each send to the wait that
receives it. Open ``<run>/timeline.json`` in ui.perfetto.dev or chrome://tracing.

Input spans are ``(kind, label, actions, start_s, end_s)`` tuples per rank and step, with
times on rank 0's clock.
"""

from __future__ import annotations

from ppx.measure.spans import CATEGORY, handoffs


def chrome_trace(steps: list[dict], stage_to_rank, title: str = "") -> dict:
    """``steps`` = [{"step": k, "ranks": {rank: [span, ...]}}] -> Chrome trace JSON (dict)."""
    all_starts = [sp[3] for s in steps for spans in s["ranks"].values() for sp in spans]
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
            for kind, label, actions, start, end in spans:
                events.append({
                    "ph": "X", "name": label, "cat": CATEGORY[kind], "pid": r, "tid": 0,
                    "ts": us(start), "dur": round((end - start) * 1e6, 3),
                    "args": {"step": s["step"], "rank": r},
                })
        for text, r, posted, peer, wait_start, wait_end in handoffs(s["ranks"], stage_to_rank):
            flow_id += 1
            arrive = max(wait_start, wait_end - 1e-6)  # inside the wait slice, so the arrow binds to it
            events.append({"ph": "s", "id": flow_id, "name": text, "cat": "p2p", "pid": r, "tid": 0, "ts": us(posted)})
            events.append({"ph": "f", "bp": "e", "id": flow_id, "name": text, "cat": "p2p", "pid": peer, "tid": 0, "ts": us(arrive)})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title, "clock": "rank 0 perf_counter"}}
