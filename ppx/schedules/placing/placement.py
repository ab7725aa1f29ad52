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

All of it runs on encoded rows (`ppx.schedules.ir.codes`), and only the placement chosen
becomes actions. A placement is skipped only where it cannot change the choice: the dry run
timed per action is a lower bound on any placement's simulated step (every placement runs
the same computes, none sooner than their inputs exist), so Megatron's placement at that
bound wins outright (ties go to it), and so does the untimed lockstep one after it; without
a full backward B both dry runs time every unit alike, and the two lockstep placements are
one.
"""

from __future__ import annotations

from ppx.schedules.comms.lockstep import dry_run, lockstep_rows, units_of
from ppx.schedules.comms.lowering import add_comms, comm_rows
from ppx.schedules.ir.action import Op
from ppx.schedules.ir.codes import COMM, OPS, B, Rows, decode, gc_paused, keep_rows, rows_of
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.ir.structure import compute_order_ok
from ppx.schedules.placing.validate import channel_mismatch, check_runs, check_structure
from ppx.schedules.sim.compiled import Compiled, compile_rows
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.simulate import cost_lists
from ppx.schedules.sim.transports import TRANSPORTS, Transport, transport_class

UNIT = Costs(fwd=1, bwd=1, wgrad=1)  # placements are compared at t_f = t_b = t_w, no communication cost
UNTIMED = (1,) * len(OPS)  # the lockstep dry run's rounds: every compute takes 1
TIMED = tuple({Op.B: 2}.get(op, 1) for op in OPS)  # ... timed as UNIT times them: B = I + W


def place_comms(schedule: Schedule, transport: str = "nccl") -> Schedule:
    """``schedule`` (compute actions) with sends and receives placed so that it runs under
    ``transport`` ("nccl" | "gloo"), and checked: Megatron's placement where it runs there at
    least as fast, else the lockstep one. ScheduleError when the compute order itself is wrong
    or cannot run."""
    with gc_paused():
        return _place(schedule, transport)


def _place(schedule: Schedule, transport: str) -> Schedule:
    compute = schedule.compute_only()
    rows = rows_of(compute)
    if not compute_order_ok(schedule, rows):
        check_structure(add_comms(schedule))  # raises, naming the first wrong action
    units = units_of(compute, rows)
    kind = TRANSPORTS.get(transport)
    if kind is None:  # as every placement's check fails: after the order's own dry run
        dry_run(compute, rows, units, TIMED)
        transport_class(transport)
    simple = comm_rows(schedule, rows)
    if not any(c >= COMM for _, oc, _ in simple for c in oc):
        return _placed(schedule, simple)  # one rank, or no hand-offs: nothing to place
    candidates = []  # (simulated step, preference, rows, program) of those that run
    got = _trial(schedule, simple, kind)
    if got is not None:
        candidates.append((got[0], 0, simple, got[1]))
    times = dry_run(compute, rows, units, TIMED)
    bound = round(max((ends[-1] for _, ends in times if ends), default=0.0), 9)
    if candidates and round(candidates[0][0], 9) <= bound:
        return _placed(schedule, simple, candidates[0][3])
    alike = not any(B in oc for _, oc, _ in rows)  # no B: both dry runs time every unit alike
    for k, costs in ((1, UNTIMED), (2, TIMED)):
        if k == 2 and alike:
            break  # the same placement as the untimed one, which wins the tie
        placed = lockstep_rows(compute, rows, units, times if alike or k == 2 else dry_run(compute, rows, units, costs))
        got = _trial(schedule, placed, kind)
        if got is None:
            if k == 1 and not candidates:  # the rounds run every order that can run: say why not
                check_runs(_placed(schedule, placed), transport, UNIT)
            continue
        candidates.append((got[0], k, placed, got[1]))
        if k == 1 and round(got[0], 9) <= bound:
            break
    step, _, placed, prog = min(candidates, key=lambda c: (round(c[0], 9), c[1]))
    return _placed(schedule, placed, prog)


def _trial(schedule: Schedule, rows: Rows, kind: Transport) -> tuple[float, Compiled] | None:
    """(simulated step at UNIT costs, program) of a placement, or None when it does not run
    under ``kind``: a send or receive without its peer, channels in different orders, or a
    deadlock (found where it happens: the run stops there)."""
    prog = compile_rows(rows, [schedule.cells(r) for r in range(schedule.num_ranks)])
    if prog.missing >= 0:
        return None
    s = kind.run(prog, *cost_lists(prog, UNIT))
    if not s.finished(prog) or channel_mismatch(prog, schedule.stage_to_rank, not kind.in_order):
        return None
    return max(s.end, default=0.0), prog


def _placed(schedule: Schedule, rows: Rows, prog: Compiled | None = None) -> Schedule:
    """``schedule`` with the encoded ``rows`` as its actions, keeping them (and their
    compiled program) for the simulations that follow."""
    placed = keep_rows(schedule.with_actions([decode(*row) for row in rows]), rows)
    if prog is not None:
        vars(placed)["_program"] = prog
    return placed


def lockstep_comms(schedule: Schedule, cost: dict | None = None) -> Schedule:
    """``schedule`` (compute actions; its comm actions are dropped) with every hand-off placed
    by a dry run at zero communication in which each action takes ``cost[op]`` (default 1 for
    every op: rounds). A send goes right after its producer; its receive in the batch the
    receiver posts when the producer ends: after the action the receiver is running then, or,
    when it idles, after its last one (posted early, while it waits). Batches hold their
    messages by send time, then in one canonical order, on both ranks."""
    with gc_paused():
        compute = schedule.compute_only()
        rows = rows_of(compute)
        units = units_of(compute, rows)
        times = dry_run(compute, rows, units, tuple((cost or {}).get(op, 1) for op in OPS))
        return _placed(schedule, lockstep_rows(compute, rows, units, times))
