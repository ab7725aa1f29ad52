"""One list-scheduling pass of the automatic zero-bubble schedule (`ppx.schedules.auto.auto_zb`):
every rank, whenever it is free, picks its next compute action on a clock of the given
per-stage costs, one stage per rank (stage r on rank r).

A free rank runs, in this order of preference: the next input-gradient pass I (or full
backward B) once its gradient has arrived, being on the critical path; else the next forward
F once its input has arrived, if fewer than ``caps[r]`` microbatches wait for their I and its
saved bytes fit the rank's limit; else the oldest pending weight pass W beyond the
``reserve[r]`` it keeps for the drain (all of them once its last I ran), which fills idle
time and frees memory; else it waits for the next arrival.
With ``recycle``, a forward that is ready but held back by memory alone first gets that W,
before any I (the paper's W inserted to recycle memory when the limit is hit).
With ``lazy_w``, a W is held back while a known arrival is nearer than the W's own length
(it would delay the I or F that arrives). Memory as `Memory` counts it: F adds a
microbatch's saved bytes, I frees its ``share`` of them (ppx's runtime: none, or the share a
split backward that stores frees; the paper: (M_B - M_W) / M_B), W the rest, B all of them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ppx.errors import ScheduleError
from ppx.schedules.auto.accounting import Memory
from ppx.schedules.ir.action import Action, Op

INF = float("inf")


@dataclass(frozen=True)
class StageTimes:
    """Per-stage seconds (any unit) of F, I and W, the runtime's overhead after every compute
    action, and the latency of one hand-off between neighbouring ranks."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    wgrad: tuple[float, ...]
    overhead: float = 0.0
    latency: float = 0.0


@dataclass(frozen=True)
class Policy:
    """One variant of the pass: per rank, the most microbatches forwarded and awaiting their
    I (``caps``) and the W's kept back for the drain (``reserve``); per stage whether the
    backward is split into I and W (``split``) or one B; W's eager or lazy."""

    caps: tuple[int, ...]
    split: tuple[bool, ...]
    lazy_w: bool = False
    prefer: str = "I"  # both ready: "I" first, "F" first, or "alt": the other kind than the rank's last
    recycle: bool = False  # a ready F held back by memory alone: the oldest pending W before any I
    reserve: tuple[int, ...] | None = None  # W's a rank keeps pending until its last I (None: 0)


def greedy_fill(
    p: int, m: int, t: StageTimes, policy: Policy, mem: Memory
) -> tuple[list[list[tuple[Op, int]]], float, bool]:
    """Each rank's compute actions as (op, microbatch) in the order the pass runs them (rank r
    runs stage r: `actions` makes them `Action`s), the pass's own predicted step (the last
    rank's end, in the costs' unit), and whether the memory limit ever held a forward back
    (if not, any larger limit gives the same order)."""
    caps, split, lazy, prefer, recycle = policy.caps, policy.split, policy.lazy_w, policy.prefer, policy.recycle
    reserve = policy.reserve or (0,) * p
    act = mem.act
    freed_by_i = [mem.share[r] * act[r] if split[r] else act[r] for r in range(p)]
    held = [0.0] * p
    bound = False
    f_in = [[INF] * m for _ in range(p)]  # when microbatch k's input reaches rank r
    g_in = [[INF] * m for _ in range(p)]  # when its output gradient does
    f_in[0] = [0.0] * m
    nf, ni, nw = [0] * p, [0] * p, [0] * p  # next F, I (or B), W microbatch per rank
    free = [0.0] * p
    last_f = [False] * p  # whether the rank's last F or I was an F
    rows: list[list[tuple[Op, int]]] = [[] for _ in range(p)]
    heap = [(0.0, r) for r in range(p)]
    while heap:
        now, r = heapq.heappop(heap)
        if now < free[r]:
            continue  # a stale wake-up: the rank is busy until free[r], which has its own
        f, i, w = nf[r], ni[r], nw[r]
        room = mem.fits(r, held[r] + act[r])
        may_f = f < m and f - i < caps[r] and room
        can_i, can_f = i < f and g_in[r][i] <= now, may_f and f_in[r][f] <= now
        blocked = f < m and f - i < caps[r] and not room  # a forward held back by memory alone
        bound = bound or blocked
        if recycle and w < i and split[r] and blocked and f_in[r][f] <= now:
            op, k, d = Op.W, w, t.wgrad[r]
        elif can_f and (not can_i or prefer == "F" or (prefer == "alt" and not last_f[r])):
            op, k, d = Op.F, f, t.fwd[r]
        elif can_i:
            op, k, d = (Op.I if split[r] else Op.B), i, t.bwd[r] + (0.0 if split[r] else t.wgrad[r])
        elif w < i and split[r] and (i - w > reserve[r] or i == m or blocked):
            if lazy:
                nxt = min(g_in[r][i] if i < f else INF, f_in[r][f] if may_f else INF)
                if nxt - now < t.wgrad[r]:
                    heapq.heappush(heap, (nxt, r))
                    continue
            op, k, d = Op.W, w, t.wgrad[r]
        else:
            continue  # idle until an arrival wakes it
        rows[r].append((op, k))
        end = now + d
        free[r] = end + t.overhead
        heapq.heappush(heap, (free[r], r))
        if op is not Op.W:
            last_f[r] = op is Op.F
        if op is Op.F:
            held[r] += act[r]
            nf[r] += 1
            if r + 1 < p:
                f_in[r + 1][k] = end + t.latency
                heapq.heappush(heap, (f_in[r + 1][k], r + 1))
            else:
                g_in[r][k] = end
        elif op is Op.W:
            held[r] -= act[r] - freed_by_i[r]
            nw[r] += 1
        else:
            held[r] -= freed_by_i[r]
            ni[r] += 1
            if r > 0:
                g_in[r - 1][k] = end + t.latency
                heapq.heappush(heap, (g_in[r - 1][k], r - 1))
    for r in range(p):
        if nf[r] < m or ni[r] < m or (split[r] and nw[r] < m):
            raise ScheduleError(f"auto_zb: the pass stopped on rank {r} at F{nf[r]} I{ni[r]} W{nw[r]} of {m}")
    return rows, max(free), bound


def actions(rows: list[list[tuple[Op, int]]]) -> tuple[tuple[Action, ...], ...]:
    """The pass's rows as `Action`s, rank r's on stage r."""
    return tuple(tuple(Action(r, op, k) for op, k in row) for r, row in enumerate(rows))
