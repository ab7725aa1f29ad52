"""What a timeline of computes alone says of the runtime's overhead and hand-offs: under
torch's runtime (``pipeline.executor=torch``) ppx times each compute, but not the sends,
receives and waits around it, so the gap between two computes is the runtime's own time, and,
before a compute that takes a tensor from another rank, a wait too. Counted whole as overhead,
those waits were simulated again (the simulator waits for the tensor itself), and the run's
predicted step came out 9-11% long (known-cost model and llama-tiny at p=2, 1F1B and GPipe)."""

from __future__ import annotations

from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule


def comms_unseen(steps: list[dict], schedule: Schedule) -> tuple[list[float], list[float]] | None:
    """(overhead per action, hand-off latencies), seconds, from ``steps`` (the run report's
    timeline) where no rank's spans hold a post or a wait while the schedule hands tensors
    between ranks; None otherwise. The overhead: every gap before a compute that takes
    nothing from another rank (its sends' posting included; in torch's own 1F1B, its wait on a
    send of the step's warm-up too). A hand-off: a compute that takes its tensor from another
    rank, where its rank finished the compute before it ahead of the producer, starts the
    latency after the producer's end, as the simulator starts it (a compute that waited starts
    when its tensor is there; what the runtime does between is in the latency)."""
    received = _receiving(schedule)
    if not received or any(sp.kind in ("post", "wait") for s in steps for spans in s["ranks"].values() for sp in spans):
        return None
    overhead, waited = [], []
    for s in steps:
        ends = {sp.action: sp.end_s for spans in s["ranks"].values() for sp in spans if sp.kind == "compute"}
        for spans in s["ranks"].values():
            computes = [sp for sp in spans if sp.kind == "compute"]
            for before, after in zip(computes, computes[1:]):
                a = after.action
                if (a.stage, a.op.value) not in received:
                    overhead.append(after.start_s - before.end_s)
                    continue
                made = next((ends[p] for p in _producers(a) if p in ends), None)
                if made is not None and before.end_s <= made:  # idle until the tensor came: all of it is transfer
                    waited.append(after.start_s - made)
    return overhead, [max(x, 0.0) for x in waited]


def _receiving(schedule: Schedule) -> set[tuple[int, str]]:
    """(stage, op) of the computes that take a tensor from another rank: a forward after a
    stage on another rank, an input-gradient backward (B or I) before one."""
    owner, n = schedule.stage_to_rank, schedule.num_stages
    out = {(st, "F") for st in range(1, n) if owner[st - 1] != owner[st]}
    return out | {(st, op) for st in range(n - 1) if owner[st + 1] != owner[st] for op in ("B", "I")}


def _producers(a):
    """The actions whose output ``a`` takes: the stage before's forward of its microbatch, or
    the stage after's input-gradient backward (B or I)."""
    if a.op is Op.F:
        return [Action(a.stage - 1, Op.F, a.mb)]
    return [Action(a.stage + 1, Op.B, a.mb), Action(a.stage + 1, Op.I, a.mb)]
