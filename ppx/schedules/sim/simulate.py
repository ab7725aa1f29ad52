"""Dry-run a schedule: prove it cannot deadlock and predict each rank's timeline.

The simulator executes each rank's program (the post, wait, compute, reduce and drain items
of `ppx.schedules.comms.program` that the runtime runs, compiled to integers by
`ppx.schedules.sim.compiled`) on a unit-free clock, event-driven (`ppx.schedules.sim.simcore`): a
rank runs until it waits for a tensor or a send not done yet, and the batch or op that
completes wakes it. When a posted send or receive completes is up to the transport, chosen
by name (`ppx.schedules.sim.transports`): ``nccl`` (the default, and what validation uses) is
the strict one, ``gloo`` the looser one ppx's runtime runs on gloo; a list that passes on
nccl also passes on gloo. A schedule keeps its compiled program, so simulating it again at
other costs only runs it.

Costs are laid out before the run: fixed `Costs` per (stage, op); other cost objects
(`SampledCosts`) are asked rank by rank in program order (each compute's work then its
overhead, each posted op, each reduce), then one latency per message, in the order of the
sends. Each draw is independent, so the order changes single draws, not their distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from ppx.errors import ScheduleError
from ppx.schedules.comms.lowering import receive_early
from ppx.schedules.ir.action import Action
from ppx.schedules.ir.codes import OPS, encode, gc_paused, rows_of
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.sim.compiled import COMPUTE, POST, REDUCE, Compiled, add_reductions, compile_rows, missing_peer
from ppx.schedules.sim.costs import Costs, SampledCosts
from ppx.schedules.sim.deadlock import deadlock_message
from ppx.schedules.sim.simcore import State
from ppx.schedules.sim.transports import Transport, transport_class


class Event(NamedTuple):
    """One compute action's predicted span on its rank (a tuple: planning makes millions)."""

    action: Action
    start: float
    end: float


@dataclass
class Timeline:
    """Predicted per-rank compute spans (each with the runtime's overhead after it); times
    start at 0. ``compute`` and ``comm`` are each rank's seconds of work and of communication,
    split as a run's measurement splits them: comm = posting + transfer, transfer being the
    part of a wait for an input after its sender began posting it. The rest is idle: waits
    for a peer that has not sent yet, the runtime's overhead between actions, the tail."""

    events: list[list[Event]]
    rank_end: list[float]
    compute: list[float]
    comm: list[float]
    dp_comm: list[float] | None = None  # seconds of data-parallel reduction per rank (simulated with reduce=True)
    makespan: float = field(init=False)

    def __post_init__(self):
        self.makespan = max(self.rank_end, default=0.0)

    def busy(self, rank: int) -> float:
        """Seconds of the rank's compute spans, overhead included."""
        return sum(e.end - e.start for e in self.events[rank])

    def idle(self, rank: int) -> float:
        reduce = self.dp_comm[rank] if self.dp_comm else 0.0
        return max(self.makespan - self.compute[rank] - self.comm[rank] - reduce, 0.0)

    def steady(self) -> float:
        """The steady-state step: the longest rank's own span, from its first compute's start to
        its end (what consecutive steps cost when no rank waits at a step boundary: the
        zero-bubble paper's cost). ``makespan`` is the synchronous step: every rank starting
        together, what `ppx run` measures."""
        return max((end - row[0].start for end, row in zip(self.rank_end, self.events) if row), default=0.0)

    def bubble_fraction(self) -> float:
        """Idle time over all ranks as a share of (ranks x makespan): a run's ``bubble_fraction``."""
        if self.makespan <= 0:
            return 0.0
        return sum(self.idle(r) for r in range(len(self.events))) / (len(self.events) * self.makespan)


_event = partial(tuple.__new__, Event)


def simulate(
    schedule: Schedule,
    costs: Costs | SampledCosts | None = None,
    transport: str = "nccl",
    recv_lookahead: int = 0,
    reduce: bool = False,
) -> Timeline:
    """Run ``schedule`` (with comm actions) on a unit-free clock; raise ScheduleError on deadlock.
    ``transport`` = "nccl" | "gloo" (see `ppx.schedules.sim.transports`). ``reduce``: with the
    data-parallel reductions a run with ``parallel.data`` > 1 has (`with_reductions`), each
    costing ``costs.reduce_cost(stage)``.

    Assumes the static checks of `ppx.schedules.placing.validate` passed (every comm op has a match).
    """
    kind = transport_class(transport)
    lookahead = recv_lookahead if kind.takes_lookahead else 0
    with gc_paused():
        prog, rows = program_of(schedule, lookahead, reduce)
        s = run(prog, costs or Costs(), kind)
        events = []
        for r, row in enumerate(rows):
            first, last = prog.c_first[r], prog.c_first[r + 1]
            acts = list(map(row.__getitem__, prog.c_pos[first:last]))
            events.append(list(map(_event, zip(acts, s.start[first:last], s.stop[first:last]))))
    return Timeline(events, s.end, s.work, s.comm, s.dp)


def program_of(schedule: Schedule, lookahead: int = 0, reduce: bool = False) -> tuple[Compiled, list]:
    """``schedule`` compiled (receives moved ``lookahead`` computes early, `receive_early`;
    ``reduce``: with the data-parallel reductions) and the rows it was compiled from. The
    plain program (no lookahead, no reductions) is made once and kept on the schedule."""
    cells = [schedule.cells(r) for r in range(schedule.num_ranks)]
    if lookahead:
        rows = [receive_early(row, lookahead, cells[r]) for r, row in enumerate(schedule.actions)]
        prog = compile_rows([encode(row) for row in rows], cells)
    elif reduce:
        rows, prog = schedule.actions, compile_rows(rows_of(schedule), cells)
    else:
        rows, prog = schedule.actions, vars(schedule).get("_program")
        if prog is None:
            prog = vars(schedule)["_program"] = compile_rows(rows_of(schedule), cells)
    if reduce:
        add_reductions(prog)
    return prog, rows


def run(prog: Compiled, costs, transport: Transport) -> State:
    """Run a compiled program at ``costs`` under ``transport``; ScheduleError on deadlock."""
    if prog.missing >= 0:
        raise ScheduleError(missing_peer(prog))
    s = transport.run(prog, *cost_lists(prog, costs))
    if not s.finished(prog):
        raise ScheduleError(deadlock_message(prog, s, transport.in_order))
    return s


def cost_lists(prog: Compiled, costs) -> tuple[list, list, list, list, list]:
    """Per compute its work and the overhead after it, per op its posting time and its
    latency (the same at both ends of a message), per reduce its time."""
    if type(costs) is Costs:  # fixed: one value per (stage, op)
        keys = prog.c_key
        work = dict.fromkeys(keys)
        for key in work:
            work[key] = costs.work(Action(key // 8, OPS[key % 8], 0))
        dur = list(map(work.__getitem__, keys))
        aft = [costs.after(Action(0, OPS[0], 0))] * len(dur)
        posting = [costs.post_cost(Action(0, op, 0)) for op in OPS]
        post = list(map(posting.__getitem__, prog.o_code))
        lat = [costs.latency()] * len(post)
        return dur, aft, post, lat, [costs.reduce_cost(stage) for stage in prog.r_stage]
    return _drawn(prog, costs)


def _drawn(prog: Compiled, costs) -> tuple[list, list, list, list, list]:
    """`cost_lists` for costs drawn per action: asked rank by rank in program order, then
    one latency per message in the order of the sends."""
    n_ops = len(prog.o_code)
    dur, aft, post = [0.0] * len(prog.c_code), [0.0] * len(prog.c_code), [0.0] * n_ops
    red, lat = [0.0] * len(prog.r_stage), [0.0] * n_ops
    for kinds, args in zip(prog.kinds, prog.args):
        for kind, x in zip(kinds, args):
            if kind == COMPUTE:
                a = Action(prog.c_stage[x], OPS[prog.c_code[x]], prog.c_mb[x])
                dur[x] = costs.work(a)
                aft[x] = costs.after(a)
            elif kind == POST:
                for o in range(prog.b_ops[x], prog.b_ops[x + 1]):
                    post[o] = costs.post_cost(Action(prog.o_stage[o], OPS[prog.o_code[o]], prog.o_mb[o]))
            elif kind == REDUCE:
                red[x] = costs.reduce_cost(prog.r_stage[x])
    for o, q in enumerate(prog.o_peer):
        if OPS[prog.o_code[o]].is_send:
            lat[o] = lat[q] = costs.latency()
    return dur, aft, post, lat, red
