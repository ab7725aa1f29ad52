"""Reading the traces a run leaves: its timeline.json (ppx's spans, one slice per program
item) and its torch.profiler traces (tb/rank<r>.*.pt.trace.json)."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

COMPUTE = re.compile(r"^(\d+)([FBIW])(\d+)$")  # a compute action's label: 1F3


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def timeline_slices(trace: dict) -> list[dict]:
    """timeline.json's slices: {"name", "cat", "rank", "step", "start_s", "end_s"} (rank 0's clock)."""
    return [
        {
            "name": e["name"],
            "cat": e["cat"],
            "rank": e["pid"],
            "step": e["args"]["step"],
            "start_s": e["ts"] / 1e6,
            "end_s": (e["ts"] + e["dur"]) / 1e6,
        }
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
    ]


def by_step(slices: list[dict]) -> dict[tuple[int, int], list[dict]]:
    """(step, rank) -> that rank's slices of the step, in time order."""
    out = defaultdict(list)
    for s in slices:
        out[(s["step"], s["rank"])].append(s)
    return {k: sorted(v, key=lambda s: s["start_s"]) for k, v in out.items()}


def profiler_traces(run_dir: Path) -> dict[int, Path]:
    """rank -> its profiler trace in ``run_dir/tb``."""
    out = {}
    for path in sorted((run_dir / "tb").glob("rank*.pt.trace.json*")):
        found = re.match(r"rank(\d+)\.", path.name)
        if found:
            out[int(found.group(1))] = path
    return out
