"""Dry-run a schedule: prove it cannot deadlock and predict each rank's timeline.

Two transports. ``nccl`` (the default, and what validation uses) is the strict one: each run of
consecutive comm actions is one batch, a rank's batches complete in order (one stream), an op
completes only once the peer's matching op sits in that peer's active batch, and a compute
action waits for the whole batch that receives its input. A list that passes here also
passes on gloo, which is looser. ``gloo`` is how ppx's runtime runs on gloo: every send and
receive completes on its own, ``p2p`` after both ends are posted, receives may be posted
``recv_lookahead`` compute actions early (`receive_early`), and a compute action waits only
for its own input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppx.errors import ScheduleError
from ppx.schedules.action import Action
from ppx.schedules.costs import Costs, SampledCosts
from ppx.schedules.lowering import comm_batches, input_receive, peer_of, receive_early
from ppx.schedules.schedule import Schedule

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
    makespan: float = field(init=False)

    def __post_init__(self):
        self.makespan = max(self.rank_end, default=0.0)

    def busy(self, rank: int) -> float:
        """Seconds of the rank's compute spans, overhead included."""
        return sum(e.end - e.start for e in self.events[rank])

    def idle(self, rank: int) -> float:
        return max(self.makespan - self.compute[rank] - self.comm[rank], 0.0)

    def bubble_fraction(self) -> float:
        """Idle time over all ranks as a share of (ranks x makespan): a run's ``bubble_fraction``."""
        if self.makespan <= 0:
            return 0.0
        return sum(self.idle(r) for r in range(len(self.events))) / (len(self.events) * self.makespan)


class _Op:
    __slots__ = ("rank", "index", "action", "batch", "done", "posted", "went")

    def __init__(self, rank, index, action, batch):
        self.rank, self.index, self.action, self.batch = rank, index, action, batch
        self.done = None  # completion time
        self.posted = None  # gloo: when its rank posted it
        self.went = None  # nccl: when both ends' batches were active, so the message could move


class _Batch:
    __slots__ = ("ops", "start", "posted", "active", "complete")

    def __init__(self):
        self.ops: list[_Op] = []
        self.start = self.posted = self.active = self.complete = None  # start: when its posting began


def simulate(schedule: Schedule, costs: Costs | SampledCosts | None = None, transport: str = "nccl",
             recv_lookahead: int = 0) -> Timeline:
    """Run ``schedule`` (with comm actions) on a unit-free clock; raise ScheduleError on deadlock.
    ``transport`` = "nccl" | "gloo" (see the module's docstring).

    Assumes the static checks of `ppx.schedules.validate` passed (every comm op has a match).
    """
    costs = costs or Costs()
    if transport not in ("nccl", "gloo"):
        raise ScheduleError(f"unknown transport {transport!r}; choose nccl or gloo")
    strict = transport == "nccl"
    rows = schedule.actions if strict else [receive_early(row, recv_lookahead) for row in schedule.actions]
    n = len(rows)
    # Build per-rank programs: ("compute", index) or ("batch", _Batch).
    programs, ops_by_key, batches_by_rank = [], {}, []
    for r, row in enumerate(rows):
        spans = {start: end for start, end in comm_batches(row)}
        prog, k, rank_batches = [], 0, []
        while k < len(row):
            if k in spans:
                b = _Batch()
                for j in range(k, spans[k]):
                    op = _Op(r, j, row[j], b)
                    b.ops.append(op)
                    ops_by_key[(r, row[j])] = op
                prog.append(("batch", b))
                rank_batches.append(b)
                k = spans[k]
            else:
                prog.append(("compute", k))
                k += 1
        programs.append(prog)
        batches_by_rank.append(rank_batches)

    def match(op: _Op) -> _Op:
        return ops_by_key[peer_of(op.action, schedule.stage_to_rank)]

    pc = [0] * n
    clock = [0.0] * n
    compute_end = [None] * n  # end of the last compute, before its overhead: when its sends leave
    queue_head = [0] * n  # index into batches_by_rank[r] of the first incomplete batch
    events: list[list[Event]] = [[] for _ in range(n)]
    work, comm = [0.0] * n, [0.0] * n

    def input_op(r: int, a: Action):
        recv = input_receive(a)
        return None if recv is None else ops_by_key.get((r, recv))

    progress = True
    while progress:
        progress = False
        for r in range(n):
            while pc[r] < len(programs[r]):
                kind, item = programs[r][pc[r]]
                if kind == "batch":
                    t = clock[r] if compute_end[r] is None else compute_end[r]
                    item.start = t
                    for op in item.ops:  # posted one after another, each out when its posting ends
                        cost = costs.post_cost(op.action)
                        t, clock[r] = t + cost, clock[r] + cost
                        op.posted = t
                        comm[r] += cost
                    item.posted = t
                    compute_end[r] = None
                    if not strict:  # each op on its own: done p2p after both ends are posted
                        for op in item.ops:
                            peer = match(op)
                            if peer.posted is not None:
                                op.done = peer.done = max(op.posted, peer.posted) + costs.latency()
                else:
                    a = rows[r][item]
                    dep = input_op(r, a)
                    ready = None if dep is None else dep.batch.complete if strict else dep.done
                    if dep is not None and ready is None:
                        break
                    start = max(clock[r], ready if dep is not None else 0.0)
                    if dep is not None and ready > clock[r]:
                        # transfer, as a run measures it: the wait after the sender began posting
                        # (nccl: after the message could move; waiting on the rest of the batch is idle)
                        moving = dep.went if strict else match(dep).batch.start
                        comm[r] += max(min(ready, dep.done) - max(clock[r], moving), 0.0)
                    duration = costs.work(a)
                    work[r] += duration
                    compute_end[r] = start + duration
                    clock[r] = compute_end[r] + costs.after(a)
                    events[r].append(Event(a, start, clock[r]))
                pc[r] += 1
                progress = True
        # Activate each rank's head batch, complete matched ops, retire finished batches.
        for r in range(n if strict else 0):
            bs = batches_by_rank[r]
            while queue_head[r] < len(bs):
                b = bs[queue_head[r]]
                if b.posted is None:
                    break
                if b.active is None:
                    prev = bs[queue_head[r] - 1].complete if queue_head[r] > 0 else 0.0
                    b.active = max(b.posted, prev)
                    progress = True
                for op in b.ops:
                    if op.done is None:
                        peer = match(op)
                        if peer.batch.active is not None and peer.done is None:
                            op.went = peer.went = max(b.active, peer.batch.active)
                            op.done = peer.done = op.went + costs.latency()
                            progress = True
                if any(op.done is None for op in b.ops):
                    break
                b.complete = max(op.done for op in b.ops)
                queue_head[r] += 1
                progress = True

    if not strict:  # a rank ends when its last op completes
        for bs in batches_by_rank:
            for b in bs:
                b.complete = max(op.done for op in b.ops) if all(op.done is not None for op in b.ops) else None
        queue_head = [next((k for k, b in enumerate(bs) if b.complete is None), len(bs)) for bs in batches_by_rank]
    stuck = []
    for r in range(n):
        if pc[r] < len(programs[r]):
            kind, item = programs[r][pc[r]]
            a = rows[r][item] if kind == "compute" else item.ops[0].action
            dep = input_op(r, a) if kind == "compute" else None
            why = f"waits for {match(dep).action} on rank {match(dep).rank}" if dep is not None else "blocked"
            stuck.append(f"rank {r} step {item if kind == 'compute' else item.ops[0].index} ({a}) {why}")
        elif queue_head[r] < len(batches_by_rank[r]):
            b = batches_by_rank[r][queue_head[r]]
            pend = [op for op in b.ops if op.done is None]
            stuck.append(
                f"rank {r} step {pend[0].index} ({pend[0].action}) never completes: "
                f"{match(pend[0]).action} on rank {match(pend[0]).rank} is not posted in time"
            )
    if stuck:
        raise ScheduleError("schedule deadlocks: " + "; ".join(stuck))
    rank_end = [
        max([clock[r]] + [b.complete for b in batches_by_rank[r]]) for r in range(n)
    ]
    return Timeline(events, rank_end, work, comm)
