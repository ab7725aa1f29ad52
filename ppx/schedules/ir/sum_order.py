"""Whether a list sums its microbatches in microbatch order: the order that makes every
family's losses and gradients equal bit for bit.

A stage adds each microbatch's weight gradients to the parameters' at its B or W, and, under a
split backward that stores, its small weights' (norms, embeddings) at its I; the last stage
adds each microbatch's loss to the step's at its forward. Floating-point sums taken in another
order round otherwise, except that the first two terms of a sum may come either way (x + y is
y + x). Every family's list, drained or not, and zb_auto's keep microbatch order; a CSV of
one's own need not (torch's LoopedBFS runs each stage's backwards from the last microbatch to
the first), and then `ppx schedule` and `ppx run` say so (`out_of_order_note`).
"""

from __future__ import annotations

from ppx.schedules.ir.action import Op
from ppx.schedules.ir.schedule import Schedule

# what is summed -> (the actions that add a microbatch to it, how a note names the sum)
SUMS = {
    "weights": ((Op.B, Op.W), "adds stage {stage}'s weight gradients of microbatch {mb} after microbatch {later}'s"),
    "inputs": (
        (Op.B, Op.I),
        "runs stage {stage}'s I of microbatch {mb} after microbatch {later}'s, where a split backward that "
        "stores adds the small weights' gradients (norms, embeddings)",
    ),
    "loss": ((Op.F,), "adds microbatch {mb}'s loss after microbatch {later}'s (its last stage's forwards)"),
}


def out_of_order(schedule: Schedule, inputs_add: bool = True) -> tuple[str, int, int, int] | None:
    """The first (sum, stage, microbatch, later microbatch) where ``schedule`` adds a microbatch
    to one of `SUMS` after a later one (beyond the first two terms), or None. ``inputs_add``:
    whether its I's may add gradients (False: ``train.split_backward=graph`` or torch's
    executor, whose I's take the input's gradient alone)."""
    last_stage = schedule.num_stages - 1
    for what, (ops, _) in SUMS.items():
        if what == "inputs" and not inputs_add:
            continue
        for row in schedule.actions:
            seen: dict[int, list[int]] = {}  # stage -> the microbatches added so far, in order
            for a in row:
                if a.op in ops and (what != "loss" or a.stage == last_stage):
                    seen.setdefault(a.stage, []).append(a.mb)
            for stage, mbs in seen.items():
                found = _first_late(mbs)
                if found is not None:
                    return (what, stage, *found)
    return None


def _first_late(mbs: list[int]) -> tuple[int, int] | None:
    """(microbatch, a later one added before it) at the first term that breaks microbatch
    order, the first two terms taken either way; None if none does."""
    done = sorted(mbs[:2])
    for mb in mbs[2:]:
        if mb < done[-1]:
            return mb, done[-1]
        done.append(mb)
    return None


def out_of_order_note(schedule: Schedule, inputs_add: bool = True) -> str | None:
    """Where ``schedule`` sums out of microbatch order (`out_of_order`), as words to follow
    the list's name, or None."""
    found = out_of_order(schedule, inputs_add)
    if found is None:
        return None
    what, stage, mb, later = found
    where = SUMS[what][1].format(stage=stage, mb=mb, later=later)
    return f"{where}: a sum in another order than every family's, so its results may differ from theirs in the last digits (rounding)"
