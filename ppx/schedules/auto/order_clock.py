"""A fixed compute order, one stage per rank, timed on the clock of `ppx.schedules.auto.greedy_fill`:
every action starts once its rank is free and its input has arrived (an F its previous
stage's activation, an I or B its next stage's gradient, ``latency`` after the producer's
end; the last stage's own F at once), and occupies its rank for its cost plus the overhead.

Two costs of an order (`order_cost`): ``sync``, every rank starting together (the step a
`ppx run` measures: the last rank's end), and ``steady``, the longest rank's own span from its
first action's start to its last one's end (the zero-bubble paper's cost: what consecutive
steps cost when no rank waits at a step boundary)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ppx.errors import ScheduleError
from ppx.schedules.auto.greedy_fill import INF, StageTimes
from ppx.schedules.ir.action import Action, Op

COSTS = ("sync", "steady")


def _dur(t: StageTimes, r: int, op: Op) -> float:
    if op is Op.F:
        return t.fwd[r]
    if op is Op.I:
        return t.bwd[r]
    if op is Op.W:
        return t.wgrad[r]
    return t.bwd[r] + t.wgrad[r]


def order_times(rows: Sequence[Sequence[Action]], m: int, t: StageTimes) -> list[list[float]]:
    """Each action's earliest start (rank r's compute actions, on stage r), on the pass's clock."""
    p = len(rows)
    f_in = [[0.0 if r == 0 else INF] * m for r in range(p)]  # when microbatch k's input reaches rank r
    g_in = [[INF] * m for _ in range(p)]  # when its output gradient does
    free, pos = [0.0] * p, [0] * p
    starts: list[list[float]] = [[] for _ in range(p)]
    todo = deque(range(p))
    fop, iop, bop, over, lat = Op.F, Op.I, Op.B, t.overhead, t.latency
    durs = [{op: _dur(t, r, op) for op in (Op.F, Op.I, Op.W, Op.B)} for r in range(p)]
    while todo:  # a rank runs until an input it needs has not arrived; its producer queues it again
        r = todo.popleft()
        row, at, n, dur, out = rows[r], pos[r], len(rows[r]), durs[r], starts[r]
        fin, gin, now = f_in[r], g_in[r], free[r]
        while at < n:
            _, op, mb = row[at]
            ready = fin[mb] if op is fop else gin[mb] if op is iop or op is bop else 0.0
            if ready == INF:
                break
            start = now if now > ready else ready
            end = start + dur[op]
            out.append(start)
            now, at = end + over, at + 1
            if op is fop:
                if r + 1 < p:
                    f_in[r + 1][mb] = end + lat
                    todo.append(r + 1)
                else:
                    gin[mb] = end
            elif (op is iop or op is bop) and r > 0:
                g_in[r - 1][mb] = end + lat
                todo.append(r - 1)
        pos[r], free[r] = at, now
    if any(pos[r] < len(rows[r]) for r in range(p)):
        raise ScheduleError("the order cannot run (an action waits for an input never produced)")
    return starts


def rank_spans(rows, starts, t: StageTimes, cost: str = "steady") -> list[float]:
    """Each rank's end (``sync``) or span from its first action's start (``steady``)."""
    ends = [s[-1] + _dur(t, r, rows[r][-1].op) + t.overhead if s else 0.0 for r, s in enumerate(starts)]
    return ends if cost == "sync" else [e - s[0] if s else 0.0 for e, s in zip(ends, starts)]


def order_cost(rows: Sequence[Sequence[Action]], m: int, t: StageTimes, cost: str = "sync") -> float:
    """``rows``' step on the pass's clock: ``sync`` (every rank starting at 0: the last end) or ``steady`` (the longest
    rank's span from its first action's start to its last one's end, overhead included)."""
    return max(rank_spans(rows, order_times(rows, m, t), t, cost), default=0.0)
