"""Interleaved zero bubble (ZB1P of Qi et al., "Zero Bubble Pipeline Parallelism", arXiv
2401.10241), in torch.distributed.pipelining's order (`ScheduleInterleavedZeroBubble`): each
of p ranks holds v stages, stage s on rank s % p, and runs interleaved 1F1B over its model
chunks with the backward split into I and W. Microbatches go in rounds of m / max(1, m // p);
rank r warms up with (v-1) such rounds plus p-r-1 forwards (interleaved 1F1B's warmup less
the p-r-1 slots a split backward no longer needs), then alternates one forward and one I,
adding one W per step once it is r steps in, and drains the W's it held back."""

from __future__ import annotations

from collections import defaultdict

from ppx.errors import ScheduleError
from ppx.schedules.ir.action import Action, F, I, W
from ppx.schedules.ir.schedule import Schedule


def rounds(p: int, m: int) -> tuple[int, int]:
    """(number of rounds, microbatches per round), as torch splits m over p ranks."""
    n = max(1, m // p)
    return n, m // n


def shape_error(p: int, m: int, v: int) -> str | None:
    """Why interleaved_zb cannot take (p, m, v): torch's rounds must split m evenly."""
    n, _ = rounds(p, m)
    if m % n:
        return (
            f"interleaved_zb needs pipeline.microbatches ({m}) to be a multiple of its "
            f"number of rounds max(1, m // pipeline.stages) = {n}"
        )
    return None


def interleaved_zb(p: int, m: int, v: int = 2) -> Schedule:
    if v < 1:
        raise ScheduleError(f"interleaved_zb needs pipeline.virtual_stages >= 1, got {v}")
    why = shape_error(p, m, v)
    if why:
        raise ScheduleError(why)
    return Schedule("interleaved_zb", m, tuple(s % p for s in range(p * v)), tuple(_rank(p, m, v, r) for r in range(p)))


def _rank(p: int, m: int, v: int, r: int) -> tuple[Action, ...]:
    """Rank r's list, step by step as torch's `_get_1f1b_rank_ops` builds it."""
    _, per_round = rounds(p, m)
    total = m * v  # forwards (and I's, and W's) on this rank
    warmup = min((v - 1) * per_round + (p - 1 - r), total)

    def fwd_stage(step: int) -> int:
        return (step // per_round) % v * p + r

    def bwd_stage(step: int) -> int:
        return (v - 1 - (step - warmup) // per_round % v) * p + r

    next_mb: dict[tuple, int] = defaultdict(int)  # (F, I or W, stage) -> its next microbatch

    def take(op, stage: int) -> Action:
        next_mb[(op, stage)] += 1
        return op(stage, next_mb[(op, stage)] - 1)

    row: list[Action] = []
    i_stages: list[int] = []  # the stage of each I so far; the W's follow them in order
    for step in range(total + warmup):  # warmup: F; steady: F, I; cooldown: I
        if step < total:
            row.append(take(F, fwd_stage(step)))
        if step >= warmup:
            i_stages.append(bwd_stage(step))
            row.append(take(I, i_stages[-1]))
            if step - warmup >= r:  # rank r holds its first r W's back
                row.append(take(W, i_stages[step - warmup - r]))
    held = max(len(i_stages) - r, 0)
    row += [take(W, s) for s in i_stages[held:]]
    return tuple(row)
