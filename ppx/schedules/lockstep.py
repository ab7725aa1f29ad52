"""The lockstep placement on encoded rows (`ppx.schedules.codes`): the dry run of a compute
order at zero communication, and the sends and receives placed by its times.

`dry_run`: every rank runs its next unit (one compute, or an overlapped cell's two) as soon
as the rank is free and the unit's inputs exist. Event-driven: a rank runs until an input is
missing, parks on it, and the unit producing it wakes the rank. The times do not depend on
the order ranks run in; neither does where a deadlock leaves them.
`lockstep_rows`: a send right after its producer; its receive in the batch the receiver
posts when the producer ends (after the unit it runs then, or, idle, after its last one);
each batch's messages by send time, then by (from stage, to stage, kind, microbatch), on
both ranks. See `ppx.schedules.placement` for why.
"""

from __future__ import annotations

import bisect

from ppx.errors import ScheduleError
from ppx.schedules.codes import OPS, RECV_B, RECV_F, SEND_B, SEND_F, F, Rows, W
from ppx.schedules.schedule import Schedule

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
    """``rows`` (compute, encoded) with every hand-off placed by the dry run's ``times``."""
    s2r, stages = schedule.stage_to_rank, schedule.num_stages
    span = max((max(mb, default=0) for _, _, mb in rows), default=0) + 1
    n = len(rows)
    after: list[dict[int, list]] = [{} for _ in range(n)]  # rank -> unit (-1: before all) -> [(t, key, op)]
    for r, (st, oc, mb) in enumerate(rows):
        mine, (_, ends) = units[r], times[r]
        bounds = mine + [len(oc)]
        for j, end in enumerate(ends):
            for k in range(mine[j], bounds[j + 1]):
                s, c = st[k], oc[k]
                if c == F and s + 1 < stages and s2r[s + 1] != r:
                    q, dst, send, recv = s2r[s + 1], s + 1, SEND_F, RECV_F
                    key = ((s * (stages + 2) + s + 2) * 2) * span + mb[k]  # (from, to, kind, mb)
                elif c != F and c != W and s > 0 and s2r[s - 1] != r:
                    q, dst, send, recv = s2r[s - 1], s - 1, SEND_B, RECV_B
                    key = ((s * (stages + 2) + s) * 2 + 1) * span + mb[k]
                else:
                    continue
                after[r].setdefault(j, []).append((end, key, s, send, mb[k]))
                at = receiving_unit(*times[q], end)
                after[q].setdefault(at, []).append((end, key, dst, recv, mb[k]))
    out: Rows = []
    for r, (st, oc, mb) in enumerate(rows):
        o_st, o_oc, o_mb = [], [], []
        mine, bounds, placed = units[r], units[r] + [len(oc)], after[r]
        for j in range(-1, len(mine)):
            if j >= 0:
                o_st += st[mine[j] : bounds[j + 1]]
                o_oc += oc[mine[j] : bounds[j + 1]]
                o_mb += mb[mine[j] : bounds[j + 1]]
            for _, _, s, c, i in sorted(placed.get(j, ())):
                o_st.append(s)
                o_oc.append(c)
                o_mb.append(i)
        out.append((o_st, o_oc, o_mb))
    return out


def receiving_unit(starts: list[float], ends: list[float], sent: float) -> int:
    """The unit after which a receiver posts a receive sent at ``sent``: the one it runs then
    (start < sent < end), else its last one ending by then (-1: none, before its first).
    ``starts``, ``ends``: its units' (a rank's units never overlap, so both only grow)."""
    k = bisect.bisect_right(ends, sent)  # units 0..k-1 end by then
    if k < len(starts) and starts[k] < sent:
        return k
    return k - 1
