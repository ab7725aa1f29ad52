"""ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, the ZB-V schedule),
in torch.distributed.pipelining's order (`ScheduleZBVZeroBubble`): each of p ranks holds two
stages in V placement, stage s on rank s for s < p and on rank 2p-1-s after (rank r holds
stages r and 2p-1-r, so rank 0 holds the first and the last, and rank p-1 hands stage p-1's
activation to stage p without a message). The backward is split into I and W.

Rank r warms up with 2(p-r)-1 forwards of its first stage, r pairs of forwards (second stage,
first stage), then p-r triples F, I, W on its second stage; in the steady state it runs F, I,
W on its first stage, then F, I, W on its second; it cools down with r pairs of I's (first
stage, second stage), p-r pairs I, W on its first stage, then the W's it held back, the
second stage's first. As torch does, the order is built for max(2p-1, m) microbatches and
those >= m are dropped: with fewer than 2p-1 the warmup is not filled."""

from __future__ import annotations

from collections import defaultdict

from ppx.schedules.ir.action import Action, F, I, W
from ppx.schedules.ir.schedule import Schedule


def v_stage_to_rank(p: int) -> tuple[int, ...]:
    """The V placement: stage s on rank s for s < p, on rank 2p-1-s after."""
    return tuple(s if s < p else 2 * p - 1 - s for s in range(2 * p))


def zbv(p: int, m: int) -> Schedule:
    return Schedule("zbv", m, v_stage_to_rank(p), tuple(_rank(p, m, r) for r in range(p)))


def _rank(p: int, m: int, r: int) -> tuple[Action, ...]:
    n = max(2 * p - 1, m)  # microbatches the order is built for; those >= m are dropped
    first, second = r, 2 * p - 1 - r
    done: dict[tuple, int] = defaultdict(int)  # (op, stage) -> its next microbatch
    row: list[Action] = []

    def run(*actions) -> None:
        for op, stage in actions:
            row.append(op(stage, done[(op, stage)]))
            done[(op, stage)] += 1

    run(*[(F, first)] * (2 * (p - r) - 1))
    for _ in range(r):
        run((F, second), (F, first))
    for _ in range(p - r):
        run((F, second), (I, second), (W, second))
    while done[(F, second)] < done[(F, first)] or done[(F, first)] < n:
        if done[(F, first)] < n:
            run((F, first))
        run((I, first), (W, first), (F, second), (I, second), (W, second))
    for _ in range(r):
        run((I, first), (I, second))
    for _ in range(p - r):
        run((I, first), (W, first))
    run(*[(W, second)] * (done[(I, second)] - done[(W, second)]))
    run(*[(W, first)] * (done[(I, first)] - done[(W, first)]))
    return tuple(a for a in row if a.mb < m)
