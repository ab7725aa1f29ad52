"""The lockstep placement on encoded rows (`ppx.schedules.ir.codes`): the dry run of a compute
order at zero communication, and the sends and receives placed by its times.

`dry_run`: every rank runs its next unit (one compute, or an overlapped cell's two) as soon
as the rank is free and the unit's inputs exist. Event-driven: a rank runs until an input is
missing, parks on it, and the unit producing it wakes the rank. The times do not depend on
the order ranks run in; neither does where a deadlock leaves them.
`lockstep_rows`: a send right after its producer; its receive in the batch the receiver
posts when the producer ends (after the unit it runs then, or, idle, after its last one);
each batch's messages by send time, then by (from stage, to stage, kind, microbatch), on
both ranks. See `ppx.schedules.placing.placement` for why.
"""

from __future__ import annotations

import bisect
from itertools import chain

import numpy as np

from ppx.errors import ScheduleError
from ppx.schedules.ir.codes import OPS, RECV_B, RECV_F, SEND_B, SEND_F, B, F, I, Rows
from ppx.schedules.ir.schedule import Schedule

Times = list[tuple[list[float], list[float]]]  # per rank: its units' starts and ends


def units_of(schedule: Schedule, rows: Rows) -> list[list[int]]:
    """Per rank, where each unit starts in its compute row (a cell's two computes are one)."""
    out = []
    for r, (_, oc, _) in enumerate(rows):
        cells, starts, k = schedule.cells(r), [], 0
        if not cells:
            out.append(list(range(len(oc))))
            continue
        while k < len(oc):
            starts.append(k)
            k += 2 if k in cells else 1
        out.append(starts)
    return out


def dry_run(schedule: Schedule, rows: Rows, units: list[list[int]], cost: tuple[float, ...]) -> Times:
    """Each unit's (start, end) when it runs as soon as its rank is free and its inputs exist;
    ``cost[op code]``: a compute's time. ScheduleError naming every blocked rank when the
    order cannot run. ``rows``: the compute rows, valid (stages and microbatches in range)."""
    size = schedule.num_stages * schedule.num_microbatches
    ready: list = [None] * (2 * size)  # when each activation (then each input gradient) exists
    waiting = [-1] * (2 * size)  # the rank parked on each
    n = len(rows)
    nxt, free = [0] * n, [0.0] * n
    times: Times = [([], []) for _ in range(n)]
    needs, makes = [], []
    for row in rows:
        x, y = _hand_offs(schedule, row)
        needs.append(x)
        makes.append(y)
    spent = [list(map(cost.__getitem__, oc)) for _, oc, _ in rows]
    stack = list(range(n - 1, -1, -1))
    while stack:
        r = stack.pop()
        starts, ends = times[r]
        need, make, took = needs[r], makes[r], spent[r]
        j, t = nxt[r], free[r]
        if len(units[r]) == len(took):  # no cells: a unit is one compute
            count = len(took)
            while j < count:
                x = need[j]
                start = t
                if x >= 0:
                    got = ready[x]
                    if got is None:
                        waiting[x] = r
                        break
                    if got > t:
                        start = got
                t = start + took[j]
                y = make[j]
                if y >= 0:
                    ready[y] = t
                    if waiting[y] >= 0:
                        stack.append(waiting[y])
                        waiting[y] = -1
                starts.append(start)
                ends.append(t)
                j += 1
        else:
            bounds = units[r] + [len(took)]
            while j < len(bounds) - 1:
                unit = range(bounds[j], bounds[j + 1])
                start = t
                blocked = next((need[k] for k in unit if need[k] >= 0 and ready[need[k]] is None), -1)
                if blocked >= 0:
                    waiting[blocked] = r
                    break
                for k in unit:
                    if need[k] >= 0 and ready[need[k]] > start:
                        start = ready[need[k]]
                t = start + sum(took[k] for k in unit)
                for k in unit:
                    y = make[k]
                    if y >= 0:
                        ready[y] = t
                        if waiting[y] >= 0:
                            stack.append(waiting[y])
                            waiting[y] = -1
                starts.append(start)
                ends.append(t)
                j += 1
        nxt[r], free[r] = j, t
    if any(nxt[r] < len(u) for r, u in enumerate(units)):
        raise ScheduleError(_stuck(schedule, rows, units, nxt, ready))
    return times


def _hand_offs(schedule: Schedule, row) -> tuple[list[int], list[int]]:
    """Per compute of an encoded row: the tensor it takes from a neighbouring stage (F the
    previous stage's activation, B and I the next stage's gradient) and the one it makes (F
    its activation, B and I its input gradient), as indices into the dry run's ``ready``:
    activations by stage * m + microbatch, then gradients; -1 for none."""
    stages, m = schedule.num_stages, schedule.num_microbatches
    size = stages * m
    take, give = [], []  # per stage * 8 + op code: the base index, or None
    for s in range(stages):
        grad_in = size + (s + 1) * m if s + 1 < stages else None
        take += [(s - 1) * m if s > 0 else None, grad_in, grad_in, None, None, None, None, None]
        give += [s * m, size + s * m, size + s * m, None, None, None, None, None]
    st, oc, mb = row
    keys = [s * 8 + c for s, c in zip(st, oc)]
    need = [-1 if b is None else b + i for b, i in zip(map(take.__getitem__, keys), mb)]
    make = [-1 if b is None else b + i for b, i in zip(map(give.__getitem__, keys), mb)]
    return need, make


def _stuck(schedule: Schedule, rows: Rows, units, nxt, ready) -> str:
    """Why no rank can run its next action (or cell): each waits for an input not yet produced."""
    waits = []
    for r, row in enumerate(rows):
        if nxt[r] == len(units[r]):
            continue
        st, oc, mb = row
        need = _hand_offs(schedule, row)[0]
        pos = units[r][nxt[r]]
        for k in range(pos, pos + (2 if pos in schedule.cells(r) else 1)):
            if need[k] < 0 or ready[need[k]] is not None:
                continue
            s = st[k] - 1 if oc[k] == F else st[k] + 1
            producer = f"{s}F{mb[k]}" if oc[k] == F else f"{s}B/I{mb[k]}"
            waits.append(
                f"rank {r} step {k} ({st[k]}{OPS[oc[k]].value}{mb[k]}) waits for {producer} on rank "
                f"{schedule.stage_to_rank[s]}"
            )
            break
    return "compute order deadlocks whatever the transport: " + "; ".join(waits)


def lockstep_rows(schedule: Schedule, rows: Rows, units: list[list[int]], times: Times) -> Rows:
    """``rows`` (compute, encoded) with every hand-off placed by the dry run's ``times``: on
    whole arrays, every compute and comm of every rank given (rank, unit after which it
    goes, compute or comm, then its position or (send time, message order)) and sorted."""
    stages, ranks = schedule.num_stages, len(rows)
    s2r = np.asarray(schedule.stage_to_rank, np.int64)
    lengths = [len(oc) for _, oc, _ in rows]
    st, oc, mb = (np.fromiter(chain.from_iterable(row[j] for row in rows), np.int64, sum(lengths)) for j in range(3))
    rank = np.repeat(np.arange(ranks), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths]) if rows else np.zeros(0, np.int64)
    unit = np.concatenate([np.repeat(np.arange(len(u)), np.diff(u + [n])) for u, n in zip(units, lengths)] or [pos])
    ends = [np.asarray(e, np.float64) for _, e in times]
    end = np.concatenate([e[u] for e, u in zip(ends, np.split(unit, np.cumsum(lengths)[:-1]))] or [pos * 0.0])
    fwd = (oc == F) & (st + 1 < stages) & (s2r[np.minimum(st + 1, stages - 1)] != rank)
    bwd = ((oc == B) | (oc == I)) & (st > 0) & (s2r[np.maximum(st - 1, 0)] != rank)
    sent = np.flatnonzero(fwd | bwd)
    f = fwd[sent]
    span = int(mb.max(initial=0)) + 1
    frm = st[sent]
    key = ((frm * (stages + 2) + np.where(f, frm + 2, frm)) * 2 + ~f) * span + mb[sent]  # (from, to, kind, mb)
    dst = np.where(f, frm + 1, frm - 1)
    q, when = s2r[dst], end[sent]
    got = np.empty(len(sent), np.int64)  # the receiver's unit after which it posts the receive
    for r in range(ranks):
        mine = np.flatnonzero(q == r)
        starts = np.asarray(times[r][0], np.float64)
        k = np.searchsorted(ends[r], when[mine], side="right")
        running = (
            (k < len(starts)) & (starts[np.minimum(k, max(len(starts) - 1, 0))] < when[mine]) if len(starts) else k < 0
        )
        got[mine] = np.where(running, k, k - 1)
    comms = len(sent)
    all_rank = np.concatenate([rank, rank[sent], q])
    slot = np.concatenate([unit, unit[sent], got])
    comm = np.repeat([0, 1], [len(st), 2 * comms])
    order_t = np.concatenate([pos.astype(np.float64), when, when])
    order_k = np.concatenate([np.zeros(len(st), np.int64), key, key])
    order = np.lexsort((order_k, order_t, comm, slot, all_rank))
    out_st = np.concatenate([st, frm, dst])[order]
    out_oc = np.concatenate([oc, np.where(f, SEND_F, SEND_B), np.where(f, RECV_F, RECV_B)])[order]
    out_mb = np.concatenate([mb, mb[sent], mb[sent]])[order]
    cuts = np.cumsum(np.bincount(all_rank, minlength=ranks))[:-1]
    return [
        (a.tolist(), b.tolist(), c.tolist())
        for a, b, c in zip(np.split(out_st, cuts), np.split(out_oc, cuts), np.split(out_mb, cuts))
    ]


def receiving_unit(starts: list[float], ends: list[float], sent: float) -> int:
    """The unit after which a receiver posts a receive sent at ``sent``: the one it runs then
    (start < sent < end), else its last one ending by then (-1: none, before its first).
    ``starts``, ``ends``: its units' (a rank's units never overlap, so both only grow). The
    rule `lockstep_rows` applies to every receive at once."""
    k = bisect.bisect_right(ends, sent)  # units 0..k-1 end by then
    if k < len(starts) and starts[k] < sent:
        return k
    return k - 1
