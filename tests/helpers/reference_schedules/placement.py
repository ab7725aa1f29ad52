"""Where a compute order's sends and receives go, so that it runs under the run's transport.

`add_comms` places each receive right before its consumer and each send right after its
producer: Megatron's placement, which the built-in schedules are written for. Some valid
compute orders deadlock that way on NCCL (torch's LoopedBFS, interleaved zero bubble, ...),
where a rank's batches complete in order. For those, `lockstep_comms` places them by a
dry run in rounds: every rank runs its next compute action as soon as its input was produced
in an earlier round, and a hand-off produced in round t is sent *and* received in round t's
batches, on both ranks, in one canonical order. Round t's batches then only match each other,
so, round by round, every batch is posted and completes: the order cannot deadlock under
either transport. The same dry run timed per action (B = I + W, a cell F + B) places them
where NCCL's in-order batches hold no rank back. `place_comms` keeps Megatron's placement
wherever it runs as fast (simulated at equal unit costs), and otherwise takes the fastest
lockstep one that runs.
"""

from __future__ import annotations

import bisect
import heapq

from helpers.reference_schedules.lowering import add_comms, peer_of, remote_outputs
from helpers.reference_schedules.validate import check_runs, check_structure
from ppx.errors import ScheduleError
from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.sim.costs import Costs

UNIT = Costs(fwd=1, bwd=1, wgrad=1)  # placements are compared at t_f = t_b = t_w, no communication cost


def place_comms(schedule: Schedule, transport: str = "nccl") -> Schedule:
    """``schedule`` (compute actions) with sends and receives placed so that it runs under
    ``transport`` ("nccl" | "gloo"), and checked: Megatron's placement where it runs there at
    least as fast, else the lockstep one. ScheduleError when the compute order itself is wrong
    or cannot run."""
    simple = add_comms(schedule)
    check_structure(simple)
    candidates = []  # (simulated step, preference, placement) of those that run
    for k, place in enumerate((add_comms, lockstep_comms, _timed_lockstep)):
        placed = simple if k == 0 else place(schedule)
        try:
            step = check_runs(placed, transport, UNIT).makespan  # the dry run that checks it, timed
        except ScheduleError as e:
            if k == 1 and not candidates:  # the rounds run every order that can run: say why not
                raise e
            continue
        candidates.append((step, k, placed))
        if k == 0 and not any(a.op.is_comm for row in placed.actions for a in row):
            break  # one rank, or no hand-offs: nothing to place
    return min(candidates, key=lambda c: (round(c[0], 9), c[1]))[2]


def _timed_lockstep(schedule: Schedule) -> Schedule:
    """The lockstep placement timed at the costs placements are compared at (B = I + W)."""
    return lockstep_comms(schedule, {Op.F: 1, Op.B: 2, Op.I: 1, Op.W: 1})


def _key(a: Action) -> tuple:
    """One message's place in a batch, the same for its send and its receive: (from stage,
    to stage, kind, microbatch)."""
    s, i = a.stage, a.mb
    frm, to = {
        Op.SEND_F: (s, s + 1),
        Op.RECV_F: (s - 1, s),
        Op.SEND_B: (s, s - 1),
        Op.RECV_B: (s + 1, s),
    }[a.op]
    return (frm, to, a.op in (Op.SEND_B, Op.RECV_B), i)


def lockstep_comms(schedule: Schedule, cost: dict | None = None) -> Schedule:
    """``schedule`` (compute actions; its comm actions are dropped) with every hand-off placed
    by a dry run at zero communication in which each action takes ``cost[op]`` (default 1 for
    every op: rounds). A send goes right after its producer; its receive in the batch the
    receiver posts when the producer ends: after the action the receiver is running then, or,
    when it idles, after its last one (posted early, while it waits). Batches hold their
    messages by send time, then in one canonical order, on both ranks."""
    s2r, last = schedule.stage_to_rank, schedule.num_stages - 1
    cost = cost or {}
    compute = schedule.compute_only()
    rows = [list(row) for row in compute.actions]
    units = [[list(u) for u in compute.units(r)] for r in range(len(rows))]
    times = _dry_run(schedule, rows, units, last, cost)  # per rank, per unit: (start, end)
    ends = [[e for _, e in t] for t in times]
    after: list[dict[int, list]] = [{} for _ in rows]  # rank -> unit index (-1: before all) -> [(t, key, op)]
    for r, rank_units in enumerate(units):
        for j, unit in enumerate(rank_units):
            end = times[r][j][1]
            for a in unit:
                for snd in remote_outputs(a, s2r):
                    q, rcv = peer_of(snd, s2r)
                    after[r].setdefault(j, []).append((end, _key(snd), snd))
                    after[q].setdefault(_receiving_unit(times[q], ends[q], end), []).append((end, _key(rcv), rcv))
    out = []
    for r, rank_units in enumerate(units):
        row = [a for _, _, a in sorted(after[r].get(-1, []))]
        for j, unit in enumerate(rank_units):
            row += unit
            row += [a for _, _, a in sorted(after[r].get(j, []))]
        out.append(row)
    return schedule.with_actions(out)


def _dry_run(schedule: Schedule, rows, units, last: int, cost: dict) -> list[list[tuple[float, float]]]:
    """(start, end) of every unit of every rank when each starts as soon as its rank is free
    and its inputs exist, the earliest start first (ties: the lower rank); ScheduleError
    naming every blocked rank when the order cannot run. Event-driven: a rank's next unit
    enters the heap once its inputs exist, with the start it keeps until it runs."""
    done: dict[tuple, float] = {}  # what was produced -> when
    free, nxt = [0.0] * len(units), [0] * len(units)
    times: list[list[tuple[float, float]]] = [[] for _ in units]
    waiting: dict[tuple, list[int]] = {}  # an input not produced yet -> the ranks whose next unit needs it
    heap: list[tuple[float, int]] = []

    def offer(r: int) -> None:
        """Queue rank ``r``'s next unit if its inputs exist, else wait for the first missing one."""
        if nxt[r] == len(units[r]):
            return
        needs = [n for n in (_input_of(a, last) for a in units[r][nxt[r]]) if n is not None]
        missing = next((n for n in needs if n not in done), None)
        if missing is not None:
            waiting.setdefault(missing, []).append(r)
        else:
            heapq.heappush(heap, (max([free[r]] + [done[n] for n in needs]), r))

    for r in range(len(units)):
        offer(r)
    while heap:
        start, r = heapq.heappop(heap)
        unit = units[r][nxt[r]]
        end = start + sum(cost.get(a.op, 1) for a in unit)
        woken = []
        for a in unit:
            if a.op is not Op.W:  # a weight gradient stays on its rank
                out = _output_of(a)
                done[out] = end
                woken += waiting.pop(out, ())
        times[r].append((start, end))
        free[r], nxt[r] = end, nxt[r] + 1
        for q in [r, *woken]:
            offer(q)
    if any(nxt[r] < len(u) for r, u in enumerate(units)):
        pos = [sum(len(u) for u in units[r][: nxt[r]]) for r in range(len(units))]
        raise ScheduleError(_stuck(schedule, rows, pos, last, done))
    return times


def _receiving_unit(times: list[tuple[float, float]], ends: list[float], sent: float) -> int:
    """The unit after which a receiver posts a receive sent at ``sent``: the one it runs then
    (start < sent < end), else its last one ending by then (-1: none, before its first).
    ``ends``: the units' ends, in order (a rank's units never overlap, so they only grow)."""
    k = bisect.bisect_right(ends, sent)  # units 0..k-1 end by then
    if k < len(times) and times[k][0] < sent:
        return k
    return k - 1


def _output_of(a: Action) -> tuple:
    """What compute ``a`` (not W) produces: its stage's activation ("F") or input gradient ("G")."""
    return (a.stage, "F" if a.op is Op.F else "G", a.mb)


def _input_of(a: Action, last: int) -> tuple | None:
    """What compute ``a`` takes from a neighbouring stage (on this rank or another), or None:
    F the previous stage's activation, B and I the next stage's gradient; W nothing."""
    if a.op is Op.F and a.stage > 0:
        return (a.stage - 1, "F", a.mb)
    if a.op in (Op.B, Op.I) and a.stage < last:
        return (a.stage + 1, "G", a.mb)
    return None


def _stuck(schedule: Schedule, rows, pos, last: int, done: dict) -> str:
    """Why no rank can run its next action (or cell): each waits for an input not yet produced."""
    waits = []
    for r, row in enumerate(rows):
        if pos[r] == len(row):
            continue
        for k in range(pos[r], pos[r] + (2 if pos[r] in schedule.cells(r) else 1)):
            need = _input_of(row[k], last)
            if need is not None and need not in done:
                stage, kind, i = need
                producer = f"{stage}{'F' if kind == 'F' else 'B/I'}{i}"
                waits.append(
                    f"rank {r} step {k} ({row[k]}) waits for {producer} on rank {schedule.stage_to_rank[stage]}"
                )
                break
    return "compute order deadlocks whatever the transport: " + "; ".join(waits)
