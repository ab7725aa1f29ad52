"""A refinement of the best ZB-shaped order (`ppx.schedules.auto.zb_family.zb_order`): a local
search over each rank's warmup forwards and held-back W's, timed on the fixed order's clock
(`ppx.schedules.auto.order_clock`), within a number of orders timed. It stands in for the paper's ILP:
the rank that idles most, and its neighbours, try one warmup more or fewer and one, two or
every later rank's held-back W more or fewer; a change that lowers the cost is kept."""

from __future__ import annotations

from ppx.schedules.auto.accounting import Memory
from ppx.schedules.auto.greedy_fill import StageTimes
from ppx.schedules.auto.order_clock import order_cost, order_times, rank_spans
from ppx.schedules.auto.zb_family import Shape, zb_order


def refine(p: int, m: int, start: Shape, t: StageTimes, mem: Memory, cost: str, tries: int):
    """(the best rows found from ``start`` within ``tries`` orders timed, its cost, its shape):
    a count, not seconds, so that the same inputs give the same order."""
    best, rows = start, zb_order(p, m, *start)
    best_cost = order_cost(rows, m, t, cost)
    tried = {start}
    improved = True
    while improved and tries > 0:
        improved = False
        spans = rank_spans(rows, order_times(rows, m, t), t, cost)
        worst = sorted(range(p), key=lambda r: -spans[r])[:2]
        for r in dict.fromkeys(q for w in worst for q in (w, w - 1, w + 1) if 0 <= q < p):
            for shape in _moves(best, r, p, m):
                if shape in tried or tries <= 0:
                    continue
                tried.add(shape)
                cand = zb_order(p, m, *shape)
                if not mem.holds(cand):
                    continue
                tries -= 1
                c = order_cost(cand, m, t, cost)
                if c < best_cost * (1 - 1e-12):
                    best, rows, best_cost, improved = shape, cand, c, True
                    break
            if improved:
                break
    return rows, best_cost, best


def _moves(s: Shape, r: int, p: int, m: int) -> list[Shape]:
    """The shapes one step from ``s`` at rank r."""
    wu, defer, w_first = list(s[0]), list(s[1]), s[2]
    out = []
    for dd in (1, -1, 2, -2):
        d = defer[:]
        d[r] = min(m, max(0, d[r] + dd))
        out.append((tuple(wu), tuple(d), w_first))
        d = defer[:r] + [min(m, max(0, x + dd)) for x in defer[r:]]
        out.append((tuple(wu), tuple(d), w_first))
    for dw in (1, -1):
        w = wu[:]
        w[r] += dw
        low = 1 if w_first else 0
        if low <= w[r] <= m and (r == 0 or w[r] <= w[r - 1]) and (r == p - 1 or w[r] >= w[r + 1]):
            out.append((tuple(w), tuple(defer), w_first))
    return out
