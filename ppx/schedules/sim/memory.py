"""A schedule's activation memory, predicted: what each rank holds over a step, from the
bytes one microbatch's forward saves on each stage (the zero-bubble paper's accounting).

Walking a rank's actions in order: F adds the stage's bytes of one microbatch; I frees the
share only the input gradient needed (``input_share``); W frees the rest; B frees all. The
peak of that running sum is the rank's peak saved activations. ppx's runtime keeps a split
backward's whole graph from I until W (W differentiates the same graph), so its I frees
nothing: ``input_share`` = 0, the default. A negative share is an I that adds: under
recomputation the forward saved only its input, and the I re-runs it and holds its graph (or
its stores) until the W.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ppx.schedules.ir.codes import B, F, I, W, rows_of
from ppx.schedules.ir.schedule import Schedule


def peak_held(
    schedule: Schedule, per_microbatch: Sequence[float], input_share: float | Sequence[float] = 0.0
) -> list[float]:
    """Each rank's predicted peak saved bytes. ``per_microbatch[s]``: bytes one microbatch's
    forward saves on stage ``s``; ``input_share``: the part of them an I frees (one value
    or one per stage). The running sum is a cumulative sum over each rank's encoded row
    (`codes.rows_of`), added in the row's order as a loop would."""
    shares = [input_share] * schedule.num_stages if isinstance(input_share, (int, float)) else list(input_share)
    saved = np.asarray(per_microbatch, np.float64)
    share = np.asarray(shares, np.float64)
    peaks = []
    for st, oc, _ in rows_of(schedule):
        stage, code = np.asarray(st, np.int64), np.asarray(oc, np.int64)
        b = saved[stage]
        change = np.zeros(len(code))
        change = np.where(code == F, b, change)
        change = np.where(code == B, -b, change)
        change = np.where(code == I, -(share[stage] * b), change)
        change = np.where(code == W, -((1 - share[stage]) * b), change)
        peaks.append(float(max(0.0, np.cumsum(change).max(initial=0.0))))
    return peaks
