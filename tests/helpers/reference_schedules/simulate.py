"""Dry-run a schedule: prove it cannot deadlock and predict each rank's timeline.

The simulator executes each rank's compiled program (`ppx.schedules.comms.program`: the post,
wait, compute and drain items the runtime runs) on a unit-free clock. When a posted send or
receive completes is up to the transport, chosen by name (`ppx.schedules.sim.transports`):
``nccl`` (the default, and what validation uses) is the strict one, ``gloo`` the looser one
ppx's runtime runs on gloo; a list that passes on nccl also passes on gloo.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.reference_schedules.lowering import peer_of
from helpers.reference_schedules.program import Step, compile_steps, with_reductions
from helpers.reference_schedules.transports import Batch, CommOp, Transport, transport_class
from ppx.errors import ScheduleError
from ppx.schedules.ir.action import Action
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.sim.costs import Costs, SampledCosts


@dataclass
class Event:
    """One compute action's predicted span on its rank."""

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

    def bubble_fraction(self) -> float:
        """Idle time over all ranks as a share of (ranks x makespan): a run's ``bubble_fraction``."""
        if self.makespan <= 0:
            return 0.0
        return sum(self.idle(r) for r in range(len(self.events))) / (len(self.events) * self.makespan)


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
    programs = [compile_steps(row, lookahead, schedule.cells(r)) for r, row in enumerate(schedule.actions)]
    if reduce:
        programs = [with_reductions(p) for p in programs]
    return _Run(schedule, programs, costs or Costs(), kind).run()


class _Run:
    """One dry run: every rank's program counter and clock, advanced in rounds until no rank
    can move (the order of the rounds is the order cost samples are drawn in)."""

    def __init__(self, schedule: Schedule, programs: list[list[Step]], costs, kind: type[Transport]):
        self.programs, self.costs, n = programs, costs, len(programs)
        self.ops: dict[tuple[int, Action], CommOp] = {}
        self.batches: dict[tuple[int, int], Batch] = {}  # (rank, program counter) -> its batch
        self.of_rank: list[list[Batch]] = [[] for _ in range(n)]  # each rank's batches in order
        for r, program in enumerate(programs):
            for pc, step in enumerate(program):
                if step.kind == "post":
                    b = self.batches[(r, pc)] = Batch()
                    b.ops = [CommOp(r, step.index + j, a, b) for j, a in enumerate(step.actions)]
                    self.ops.update({(r, op.action): op for op in b.ops})
                    self.of_rank[r].append(b)
        for op in self.ops.values():
            op.peer = self.ops.get(peer_of(op.action, schedule.stage_to_rank))
            if op.peer is None:
                raise ScheduleError(f"rank {op.rank} step {op.index} ({op.action}) has no matching send or receive")
        self.transport = kind(self.of_rank, costs)
        self.pc, self.clock = [0] * n, [0.0] * n
        self.compute_end = [None] * n  # end of the last compute, before its overhead: when its sends leave
        self.events: list[list[Event]] = [[] for _ in range(n)]
        self.work, self.comm, self.end = [0.0] * n, [0.0] * n, [0.0] * n
        self.dp_comm = [0.0] * n

    def run(self) -> Timeline:
        progress = True
        while progress:
            progress = False
            for r, program in enumerate(self.programs):
                while self.pc[r] < len(program) and self._step(r, program[self.pc[r]]):
                    self.pc[r] += 1
                    progress = True
            progress |= self.transport.advance()
        stuck = [self._stuck(r) for r in range(len(self.programs)) if self.pc[r] < len(self.programs[r])]
        if stuck:
            raise ScheduleError("schedule deadlocks: " + "; ".join(stuck))
        return Timeline(self.events, self.end, self.work, self.comm, self.dp_comm)

    def _step(self, r: int, step: Step) -> bool:
        """Execute ``step`` on rank ``r``; False while it blocks."""
        if step.kind == "post":
            self._post(r, self.batches[(r, self.pc[r])])
        elif step.kind == "wait":
            dep = self.ops[(r, step.actions[0])]
            ready = self.transport.ready(dep)
            if ready is None:
                return False
            if ready > self.clock[r]:
                # transfer, as a run measures it: the wait after the sender began posting
                # (nccl: after the message could move; waiting on the rest of the batch is idle)
                moving = self.transport.moving(dep)
                self.comm[r] += max(min(ready, dep.done) - max(self.clock[r], moving), 0.0)
                self.clock[r] = ready
        elif step.kind == "compute":
            a, start = step.actions[0], self.clock[r]
            duration = self.costs.work(a)
            self.work[r] += duration
            self.compute_end[r] = start + duration
            self.clock[r] = self.compute_end[r] + self.costs.after(a)
            self.events[r].append(Event(a, start, self.clock[r]))
        elif step.kind == "reduce":  # blocks the rank, after its last compute's overhead
            duration = self.costs.reduce_cost(step.actions[0].stage)
            self.dp_comm[r] += duration
            self.clock[r] += duration
        else:  # drain: a rank ends when its last op completes
            done = [self.transport.complete(b) for b in self.of_rank[r]]
            if None in done:
                return False
            self.end[r] = max([self.clock[r]] + done)
        return True

    def _post(self, r: int, b: Batch) -> None:
        """Post ``b``'s ops one after another, each out when its posting ends, from the end of
        the compute before it (its overhead runs meanwhile)."""
        t = self.clock[r] if self.compute_end[r] is None else self.compute_end[r]
        b.start = t
        for op in b.ops:
            cost = self.costs.post_cost(op.action)
            t, self.clock[r] = t + cost, self.clock[r] + cost
            op.posted = t
            self.comm[r] += cost
        b.posted = t
        self.compute_end[r] = None
        self.transport.posted(b)

    def _stuck(self, r: int) -> str:
        """Why rank ``r`` cannot go on, for the deadlock message: the op it waits for (on
        nccl, the first unfinished op of its oldest unfinished batch, which all that follows
        on the rank's one stream waits for) and what holds that op's peer: not posted yet, or
        posted behind an unfinished batch of the peer's own."""
        program, pc = self.programs[r], self.pc[r]
        awaited = self.ops[(r, program[pc].actions[0])] if program[pc].kind == "wait" else None
        head = getattr(self.transport, "head", None)  # nccl: each rank's oldest unfinished batch
        if head is not None and head[r] < len(self.of_rank[r]):
            op = next(o for o in self.of_rank[r][head[r]].ops if o.done is None)
        else:
            op = awaited or next(o for b in self.of_rank[r] for o in b.ops if o.done is None)
        peer, q = op.peer, op.peer.rank
        if op is awaited:  # the compute action after the wait needs this very receive
            consumer = program[pc + 1]
            who = f"rank {r} step {consumer.index} ({consumer.actions[0]}) waits for {peer.action} on rank {q}"
            if peer.posted is None:
                return who
        elif head is None:
            return f"rank {r} step {op.index} ({op.action}) never completes: {peer.action} on rank {q} is not posted in time"
        else:
            sends = [o.action.op.is_send for o in op.batch.ops]
            kind = (
                "a batch of sends only"
                if all(sends)
                else "a batch of receives only"
                if not any(sends)
                else "in a batch of sends and receives"
            )
            who = f"rank {r} step {op.index} ({op.action}), {kind}, waits for {peer.action} on rank {q}"
            if peer.posted is None:
                return f"{who}, which rank {q} posts only at step {peer.index}"
        # posted, but queued on the peer's one stream behind an unfinished batch of its own
        blocker = self.of_rank[q][head[q]].ops
        return (
            f"{who} (step {peer.index}), which rank {q} starts only after its own batch at step "
            f"{blocker[0].index} ({' '.join(str(o.action) for o in blocker)}) completes"
        )
