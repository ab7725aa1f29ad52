"""The parametric zero-bubble orders `ppx.schedules.auto.auto_zb` also searches, one stage per rank:
ZB-H1's and ZB-H2's shape with each rank's warmup forwards and held-back weight passes chosen
per rank. Their regular steady state (one F, one I, one W per microbatch) suits NCCL's
in-order batches, where the list-scheduling pass's orders can wait on each other's sends.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppx.schedules.ir.action import Action, F, I, W


def zb_order(p: int, m: int, warmup: Sequence[int], deferred: Sequence[int], w_first: bool) -> list[list[Action]]:
    """Rank r: ``warmup[r]`` forwards, then per microbatch k its I, preceded by the next
    forward (ZB-H1's shape) or followed by it (``w_first``: ZB-H2's I, W, F), with a W after
    each I from the ``deferred[r]``-th on; then the W's held back. Runs whenever ``warmup`` does
    not grow with r (a rank has sent every forward the next one needs before it waits) and,
    in ZB-H2's shape, is at least 1."""
    rows = []
    for r in range(p):
        wu = min(warmup[r], m)
        row, w_next = [F(r, i) for i in range(wu)], 0
        for k in range(m):
            if not w_first and wu + k < m:
                row.append(F(r, wu + k))
            row.append(I(r, k))
            if k >= deferred[r]:
                row.append(W(r, w_next))
                w_next += 1
            if w_first and wu + k < m:
                row.append(F(r, wu + k))
        rows.append(row + [W(r, i) for i in range(w_next, m)])
    return rows


def family(p: int, m: int, slots: Sequence[int]) -> list[list[list[Action]]]:
    """The searched members: warmups (ZB-H2's 2(p-r-1)+1, 1F1B's p-r-1; larger ones, such as
    the memory's, ran far slower), made non-increasing in r, x held-back W's (as many as
    memory leaves, ZB-H1's r, ZB-H2's 2r, none) x both shapes; the warmup and held-back W's
    within each rank's ``slots`` (a rank holds at most warmup + 1 + deferred)."""
    warmups = [[2 * (p - r - 1) + 1 for r in range(p)], [p - r - 1 for r in range(p)]]
    out, seen = [], set()
    for raw in warmups:
        for w_first in (False, True):  # ZB-H2's shape holds warmup + deferred, ZB-H1's one more
            wu = [min(raw[r], slots[r] - (0 if w_first else 1), m) for r in range(p)]
            for r in range(1, p):  # non-increasing: every rank has sent what the next needs
                wu[r] = min(wu[r], wu[r - 1])
            if w_first:
                wu = [max(x, 1) for x in wu]  # its first I needs its first F
            room = [max(0, slots[r] - wu[r] - (0 if w_first else 1)) for r in range(p)]
            for defer in (room, list(range(p)), [2 * r for r in range(p)], [0] * p):
                key = (tuple(wu), tuple(min(defer[r], room[r]) for r in range(p)), w_first)
                if key not in seen:
                    seen.add(key)
                    out.append(zb_order(p, m, key[0], key[1], w_first))
    return out
