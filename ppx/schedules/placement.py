"""Where a compute order's sends and receives go, so that it runs under the run's transport.

`add_comms` places each receive right before its consumer and each send right after its
producer: Megatron's placement, which the built-in schedules are written for. Some valid
compute orders deadlock that way on NCCL (torch's LoopedBFS, interleaved zero bubble, ...),
where a rank's batches complete in order. For those, `lockstep_comms` places them by a
dry run in rounds: every rank runs its next compute action as soon as its input was produced
in an earlier round, and a hand-off produced in round t is sent *and* received in round t's
batches, on both ranks, in one canonical order. Round t's batches then only match each other,
so, round by round, every batch is posted and completes: the order cannot deadlock under
either transport. `place_comms` keeps Megatron's placement wherever it runs as fast (simulated
at equal unit costs), and takes the lockstep one where Megatron's deadlocks or is slower (on
NCCL, an early batch can hold a rank's later ones back).
"""

from __future__ import annotations

from ppx.errors import ScheduleError
from ppx.schedules.action import Action, Op
from ppx.schedules.costs import Costs
from ppx.schedules.lowering import add_comms
from ppx.schedules.schedule import Schedule
from ppx.schedules.simulate import simulate
from ppx.schedules.validate import check_runs, check_structure

UNIT = Costs(fwd=1, bwd=1, wgrad=1)


def place_comms(schedule: Schedule, transport: str = "nccl") -> Schedule:
    """``schedule`` (compute actions) with sends and receives placed so that it runs under
    ``transport`` ("nccl" | "gloo"), and checked: Megatron's placement where it runs there at
    least as fast, else the lockstep one. ScheduleError when the compute order itself is wrong
    or cannot run."""
    simple = add_comms(schedule)
    check_structure(simple)
    try:
        check_runs(simple, transport)
    except ScheduleError:
        placed = lockstep_comms(schedule)
        check_runs(placed, transport)
        return placed
    try:  # Megatron's runs; keep it unless it costs the order time the lockstep one does not
        placed = lockstep_comms(schedule)
        check_runs(placed, transport)
    except ScheduleError:
        return simple
    return placed if _step(placed, transport) < _step(simple, transport) - 1e-9 else simple


def _step(schedule: Schedule, transport: str) -> float:
    """The schedule's simulated step at t_f = t_b = t_w = 1, no communication cost."""
    return simulate(schedule, UNIT, transport).makespan


def _messages(a: Action, s2r, last: int) -> list[tuple[Action, Action]]:
    """(send, receive) pairs that compute ``a`` produces for other ranks."""
    s, i = a.stage, a.mb
    out = []
    if a.op is Op.F and s < last and s2r[s + 1] != s2r[s]:
        out.append((Action(s, Op.SEND_F, i), Action(s + 1, Op.RECV_F, i)))
    if a.op in (Op.B, Op.I) and s > 0 and s2r[s - 1] != s2r[s]:
        out.append((Action(s, Op.SEND_B, i), Action(s - 1, Op.RECV_B, i)))
    return out


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


def lockstep_comms(schedule: Schedule) -> Schedule:
    """``schedule`` (compute actions; its comm actions are dropped) with every hand-off sent
    and received in the round its producer ran, rounds from a unit-time dry run."""
    s2r, last = schedule.stage_to_rank, schedule.num_stages - 1
    rows = [[a for a in row if a.op.is_compute] for row in schedule.actions]
    pos = [0] * len(rows)
    done: dict[tuple, int] = {}  # (stage, "F" | "G", microbatch) -> the round it was produced
    out: list[list[Action]] = [[] for _ in rows]
    batch: list[list[Action]] = [[] for _ in rows]  # this round's comm actions per rank
    t = 0
    while any(pos[r] < len(row) for r, row in enumerate(rows)):
        runs = []
        for r, row in enumerate(rows):
            if pos[r] == len(row):
                continue
            unit = row[pos[r] : pos[r] + (2 if pos[r] in schedule.cells(r) else 1)]  # a cell runs whole
            needs = [_input_of(a, last) for a in unit]
            if all(need is None or done.get(need, t) < t for need in needs):
                runs.append((r, unit))
        if not runs:
            raise ScheduleError(_stuck(schedule, rows, pos, last, done))
        for r, unit in runs:
            pos[r] += len(unit)
            for a in unit:
                done[_output_of(a)] = t
                for snd, rcv in _messages(a, s2r, last):
                    batch[r].append(snd)
                    batch[s2r[rcv.stage]].append(rcv)
        for r, unit in runs:
            out[r] += unit  # the round's compute, then the round's batch
        for r in range(len(rows)):
            out[r] += sorted(batch[r], key=_key)
            batch[r] = []
        t += 1
    return schedule.with_actions(out)


def _output_of(a: Action) -> tuple:
    """What compute ``a`` produces: its stage's activation ("F") or input gradient ("G")."""
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
