"""Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", arXiv 2211.05953), in
torch.distributed.pipelining's order (`ScheduleLoopedBFS`): each of p ranks holds v stages,
stage s on rank s % p; a rank runs every microbatch's forward on its first stage, then on its
next, and so on (breadth first: the earlier stage first, all microbatches at once), then the
backwards from its last stage to its first, each stage's microbatches in reverse order. GPipe
looped over v chunks: all m microbatches are in flight on every stage at the peak."""

from __future__ import annotations

from ppx.errors import ScheduleError
from ppx.schedules.ir.action import B, F
from ppx.schedules.ir.schedule import Schedule


def looped_bfs(p: int, m: int, v: int = 2) -> Schedule:
    if v < 1:
        raise ScheduleError(f"looped_bfs needs pipeline.virtual_stages >= 1, got {v}")
    rows = []
    for r in range(p):
        stages = [c * p + r for c in range(v)]
        row = [F(s, i) for s in stages for i in range(m)]
        row += [B(s, i) for s in reversed(stages) for i in reversed(range(m))]
        rows.append(tuple(row))
    return Schedule("looped_bfs", m, tuple(s % p for s in range(p * v)), tuple(rows))
