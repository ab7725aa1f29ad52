"""The parametric zero-bubble orders `ppx.schedules.auto.auto_zb` also searches, one stage per rank:
ZB-H1's and ZB-H2's shape with each rank's warmup forwards and held-back weight passes chosen
per rank. Their regular steady state (one F, one I, one W per microbatch) suits NCCL's
in-order batches, where the list-scheduling pass's orders can wait on each other's sends.
Warmups that fill each rank's wait for its first gradient, hand-offs included, and W's held
back on the later ranks (so the gradients reach rank 0 as fast as it takes them) are what
brings ZB-H2's shape to the paper's ZB-2p on its own settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from ppx.schedules.auto.accounting import Memory
from ppx.schedules.ir.action import Action, Op


@lru_cache(maxsize=256)
def _actions(r: int, m: int) -> tuple[tuple[Action, ...], ...]:
    """Rank r's F, I and W actions of every microbatch, made once."""
    return tuple(tuple(Action(r, op, i) for i in range(m)) for op in (Op.F, Op.I, Op.W))


def zb_order(p: int, m: int, warmup: Sequence[int], deferred: Sequence[int], w_first: bool) -> list[list[Action]]:
    """Rank r: ``warmup[r]`` forwards, then per microbatch k its I, preceded by the next
    forward (ZB-H1's shape) or followed by it (``w_first``: ZB-H2's I, W, F), with a W after
    each I from the ``deferred[r]``-th on; then the W's held back. Runs whenever ``warmup`` does
    not grow with r (a rank has sent every forward the next one needs before it waits) and,
    in ZB-H2's shape, is at least 1."""
    rows = []
    for r in range(p):
        fs, is_, ws = _actions(r, m)
        wu = min(warmup[r], m)
        row, w_next = list(fs[:wu]), 0
        add = row.append
        for k in range(m):
            if not w_first and wu + k < m:
                add(fs[wu + k])
            add(is_[k])
            if k >= deferred[r]:
                add(ws[w_next])
                w_next += 1
            if w_first and wu + k < m:
                add(fs[wu + k])
        rows.append(row + list(ws[w_next:]))
    return rows


DEFER_PER_RANK = (0, 1, 2, 2.5, 2.75, 3, 3.25, 3.5, 4, 5)  # held-back W's per rank below the first, times r
DEFER_AT_SCALE = (0, 2, 2.75, 3, 3.25, 4)  # the same, not ``wide``


def warmups(p: int, m: int, trips: Sequence[float], wide: bool) -> list[list[int]]:
    """The warmup vectors tried: as many forwards as fill each rank's wait for its first
    gradient (``trips[r]``: that wait in forwards of its stage), one more, and one fewer on
    every rank but the first (a rank still busy with a forward when the gradient arrives
    delays it for every rank above), ZB-H2's 2(p-r-1)+1 and 1F1B's p-r-1."""
    out = [[math.ceil(x - 1e-9) + extra for x in trips] for extra in (0, 1)]
    out.append([math.ceil(x - 1e-9) if r == 0 else math.floor(x + 1e-9) for r, x in enumerate(trips)])
    if wide:
        out += [[2 * (p - r - 1) + 1 for r in range(p)], [p - r - 1 for r in range(p)]]
    return [[min(w, m) for w in ws] for ws in out]


Shape = tuple[tuple[int, ...], tuple[int, ...], bool]  # (warmup, deferred, w_first) per rank: `zb_order`'s


def family(p: int, m: int, trips: Sequence[float], mem: Memory, wide: bool = True) -> list[tuple[Shape, list]]:
    """The searched members that hold within ``mem``: `warmups` x both shapes, each rank's
    warmup cut to what its limit holds and made non-increasing in r, x held-back W's (k·r for
    k in DEFER_PER_RANK, and as many as the limit leaves), cut to what the limit leaves.
    Not ``wide`` (large shapes, where each member costs a second): ZB-H2's shape with the
    warmups that fill the wait, alone. Each as (its shape, its rows)."""
    out, seen = [], set()
    for raw in warmups(p, m, trips, wide):
        for w_first in (True, False) if wide else (True,):  # ZB-H2's shape holds warmup + deferred, ZB-H1's one more
            extra = 0 if w_first else 1
            wu = [min(raw[r], _whole(mem.limit[r], mem.act[r], m) - extra) for r in range(p)]
            for r in range(1, p):  # non-increasing: every rank has sent what the next needs
                wu[r] = min(wu[r], wu[r - 1])
            wu = [max(x, 1 if w_first else 0) for x in wu]  # ZB-H2's first I needs its first F
            room = [_whole(mem.limit[r] - (wu[r] + extra) * mem.act[r], _w_bytes(mem, r), m) for r in range(p)]
            ks = DEFER_PER_RANK if wide else DEFER_AT_SCALE
            defers = [[int(k * r) for r in range(p)] for k in ks] + [room]
            for defer in defers:
                key = (tuple(wu), tuple(max(0, min(defer[r], room[r], m)) for r in range(p)), w_first)
                if key not in seen:
                    seen.add(key)
                    rows = zb_order(p, m, key[0], key[1], w_first)
                    if mem.holds(rows):
                        out.append((key, rows))
    return out


def _w_bytes(mem: Memory, r: int) -> float:
    """Bytes a microbatch holds on rank r between its I and its W."""
    return (1 - mem.share[r]) * mem.act[r]


def _whole(limit: float, size: float, m: int) -> int:
    """How many ``size``s fit ``limit`` (m when size is 0 or the limit is unbounded)."""
    if size <= 0 or not math.isfinite(limit):
        return m
    return max(0, min(m, int(math.floor(limit / size * (1 + 1e-12)))))
