"""Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", arXiv 2211.05953), as
torch.distributed.pipelining orders it (`ScheduleLoopedBFS`) but for one thing: each of p ranks
holds v stages, stage s on rank s % p; a rank runs every microbatch's forward on its first
stage, then on its next, and so on (breadth first: the earlier stage first, all microbatches at
once), then the backwards from its last stage to its first. GPipe looped over v chunks: all m
microbatches are in flight on every stage at the peak.

The one difference: each stage's backwards run in microbatch order, where torch's run them
last to first. A stage's gradients are the sum of its microbatches', and fp32 addition in
another order rounds differently: in torch's order the gradients, and after a few steps the
losses, differed from every other schedule's and from one process's in the last bits (measured:
58% of a transformer's gradient values after one step, by up to 2e-9). In this order they are
the same to the bit; nothing else changes (every microbatch is in flight either way, and the
bubble and the timing are the same)."""

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
        row += [B(s, i) for s in reversed(stages) for i in range(m)]
        rows.append(tuple(row))
    return Schedule("looped_bfs", m, tuple(s % p for s in range(p * v)), tuple(rows))
