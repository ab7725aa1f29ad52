"""Why a simulated run cannot go on: the deadlock message, naming what waits for what."""

from __future__ import annotations

from ppx.schedules.ir.codes import IS_SEND, text
from ppx.schedules.sim.compiled import COMPUTE, WAIT, Compiled
from ppx.schedules.sim.simcore import State


def deadlock_message(prog: Compiled, s: State, nccl: bool) -> str:
    """The ScheduleError text for a run stopped short: every rank not finished, and why."""
    stuck = [_stuck(prog, s, r, nccl) for r in range(s.n) if s.pc[r] < len(prog.kinds[r])]
    return "schedule deadlocks: " + "; ".join(stuck)


def _op(prog: Compiled, o: int) -> str:
    return text(prog.o_stage[o], prog.o_code[o], prog.o_mb[o])


def _item(prog: Compiled, r: int, j: int) -> str:
    """The action of rank ``r``'s item ``j``: a compute's, or a wait's receive."""
    x = prog.args[r][j]
    if prog.kinds[r][j] == COMPUTE:
        return text(prog.c_stage[x], prog.c_code[x], prog.c_mb[x])
    return _op(prog, x)


def _stuck(prog: Compiled, s: State, r: int, nccl: bool) -> str:
    """Why rank ``r`` cannot go on: the op it waits for (on nccl, the first unfinished op of
    its oldest unfinished batch, which all that follows on the rank's one stream waits for)
    and what holds that op's peer: not posted yet, or posted behind an unfinished batch of
    the peer's own."""
    pc, b_ops, b_first = s.pc[r], prog.b_ops, prog.b_first
    awaited = prog.args[r][pc] if prog.kinds[r][pc] == WAIT else None
    if nccl and s.head[r] < b_first[r + 1]:
        op = next(o for o in range(b_ops[s.head[r]], b_ops[s.head[r] + 1]) if s.o_done[o] is None)
    else:
        mine = range(b_ops[b_first[r]], b_ops[b_first[r + 1]])
        op = awaited if awaited is not None else next(o for o in mine if s.o_done[o] is None)
    peer = prog.o_peer[op]
    q = prog.o_rank[peer]
    if op == awaited:  # the compute action after the wait needs this very receive
        who = (
            f"rank {r} step {prog.index[r][pc + 1]} ({_item(prog, r, pc + 1)}) waits for {_op(prog, peer)} on rank {q}"
        )
        if s.b_posted[prog.o_batch[peer]] is None:
            return who
    elif not nccl:
        return (
            f"rank {r} step {prog.o_index[op]} ({_op(prog, op)}) never completes: {_op(prog, peer)} on rank {q} "
            "is not posted in time"
        )
    else:
        b = prog.o_batch[op]
        sends = [IS_SEND[prog.o_code[o]] for o in range(b_ops[b], b_ops[b + 1])]
        kind = (
            "a batch of sends only"
            if all(sends)
            else "a batch of receives only"
            if not any(sends)
            else "in a batch of sends and receives"
        )
        who = f"rank {r} step {prog.o_index[op]} ({_op(prog, op)}), {kind}, waits for {_op(prog, peer)} on rank {q}"
        if s.b_posted[prog.o_batch[peer]] is None:
            return f"{who}, which rank {q} posts only at step {prog.o_index[peer]}"
    # posted, but queued on the peer's one stream behind an unfinished batch of its own
    blocker = range(b_ops[s.head[q]], b_ops[s.head[q] + 1])
    return (
        f"{who} (step {prog.o_index[peer]}), which rank {q} starts only after its own batch at step "
        f"{prog.o_index[blocker[0]]} ({' '.join(_op(prog, o) for o in blocker)}) completes"
    )
