"""A fixed compute order, one stage per rank, timed on the clock of `ppx.schedules.auto.greedy_fill`:
every action starts once its rank is free and its input has arrived (an F its previous
stage's activation, an I or B its next stage's gradient, ``latency`` after the producer's
end; the last stage's own F at once), and occupies its rank for its cost plus the overhead.
It ranks handcrafted orders against the pass's own ones where the simulator is too slow."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ppx.errors import ScheduleError
from ppx.schedules.auto.greedy_fill import INF, StageTimes
from ppx.schedules.ir.action import Action, Op


def order_step(rows: Sequence[Sequence[Action]], m: int, t: StageTimes) -> float:
    """The step of ``rows`` (rank r's compute actions, on stage r) on the pass's clock."""
    p = len(rows)
    f_in = [[0.0 if r == 0 else INF] * m for r in range(p)]  # when microbatch k's input reaches rank r
    g_in = [[INF] * m for _ in range(p)]  # when its output gradient does
    free, pos = [0.0] * p, [0] * p
    todo = deque(range(p))
    while todo:
        r = todo.popleft()
        row = rows[r]
        while pos[r] < len(row):
            a = row[pos[r]]
            ready = f_in[r][a.mb] if a.op is Op.F else g_in[r][a.mb] if a.op in (Op.I, Op.B) else 0.0
            if ready == INF:
                break
            start = max(free[r], ready)
            d = {Op.F: t.fwd[r], Op.I: t.bwd[r], Op.W: t.wgrad[r], Op.B: t.bwd[r] + t.wgrad[r]}[a.op]
            free[r], pos[r] = start + d + t.overhead, pos[r] + 1
            if a.op is Op.F and r + 1 < p:
                f_in[r + 1][a.mb] = start + d + t.latency
                todo.append(r + 1)
            elif a.op is Op.F:
                g_in[r][a.mb] = start + d
            elif a.op in (Op.I, Op.B) and r > 0:
                g_in[r - 1][a.mb] = start + d + t.latency
                todo.append(r - 1)
    if any(pos[r] < len(rows[r]) for r in range(p)):
        raise ScheduleError("order_step: the order cannot run (an action waits for an input never produced)")
    return max(free)
