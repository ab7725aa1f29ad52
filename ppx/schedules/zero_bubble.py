"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241): 1F1B with the
backward split into an input-gradient pass I (on the critical path, sent upstream at once)
and a weight-gradient pass W (off it). Rank r runs 1F1B's p-r-1 warmup forwards, then
F, I pairs, holding its first r weight passes back so they fill the drain bubble; every
rank then holds at most p microbatches, 1F1B's peak. With t_f = t_b = t_w the bubble drops
from 1F1B's 3(p-1) units to (p-1): a third."""

from __future__ import annotations

from ppx.schedules.action import F, I, W
from ppx.schedules.schedule import Schedule


def zb_h1(p: int, m: int) -> Schedule:
    rows = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [F(r, i) for i in range(warmup)]
        deferred = r  # weight passes this rank holds back
        w_next = 0
        for k in range(m):  # the k-th input-gradient pass, after the (warmup+k)-th forward
            if warmup + k < m:
                row.append(F(r, warmup + k))
            row.append(I(r, k))
            if k >= deferred:
                row.append(W(r, w_next))
                w_next += 1
        row += [W(r, i) for i in range(w_next, m)]
        rows.append(row)
    return Schedule("zb_h1", m, tuple(range(p)), tuple(tuple(x) for x in rows))
