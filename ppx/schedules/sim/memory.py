"""A schedule's activation memory, predicted: what each rank holds over a step, from the
bytes one microbatch's forward saves on each stage (the zero-bubble paper's accounting).

Walking a rank's actions in order: F adds the stage's bytes of one microbatch; I frees the
share only the input gradient needed (``input_share``); W frees the rest; B frees all. The
peak of that running sum is the rank's peak saved activations. ppx's runtime keeps a split
backward's whole graph from I until W (W differentiates the same graph), so its I frees
nothing: ``input_share`` = 0, the default. A negative share is an I that adds: under
recomputation the forward saved only its input, and the I re-runs it and holds its graph (or
its stores) until the W.

Two stages of one rank, one after the other (a V's turn), can save one tensor between them: the
first stage's output, handed on in place, saved by its last op (a ReLU keeps its output) and
by the next stage's first (a Linear keeps its input). ``shared[s]``, (bytes, until), is that
of stage ``s``: counted once from its F until the first of the two lets it go, which a run
measured (`ppx.measure.shared_saves`) and ``until`` names: ``"its I"``, ``"the I before"``
(the stage before's I, or the stage's own W or B if first) or ``"a W"`` (the first W or B of
the two).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ppx.schedules.ir.codes import B, F, I, W, rows_of
from ppx.schedules.ir.schedule import Schedule

UNTIL = ("its I", "the I before", "a W")  # when the first of two stages lets a saved tensor go


def peak_held(
    schedule: Schedule,
    per_microbatch: Sequence[float],
    input_share: float | Sequence[float] = 0.0,
    shared: Sequence[tuple[float, str] | None] | None = None,
) -> list[float]:
    """Each rank's predicted peak saved bytes. ``per_microbatch[s]``: bytes one microbatch's
    forward saves on stage ``s``; ``input_share``: the part of them an I frees (one value
    or one per stage); ``shared[s]``: (bytes, until) of them the stage before saves too, where
    it is on the same rank (above), or None. The running sum is a cumulative sum over each
    rank's encoded row (`codes.rows_of`), added in the row's order as a loop would."""
    shares = [input_share] * schedule.num_stages if isinstance(input_share, (int, float)) else list(input_share)
    saved = np.asarray(per_microbatch, np.float64)
    share = np.asarray(shares, np.float64)
    peaks = []
    for st, oc, mbs in rows_of(schedule):
        stage, code = np.asarray(st, np.int64), np.asarray(oc, np.int64)
        b = saved[stage]
        change = np.zeros(len(code))
        change = np.where(code == F, b, change)
        change = np.where(code == B, -b, change)
        change = np.where(code == I, -(share[stage] * b), change)
        change = np.where(code == W, -((1 - share[stage]) * b), change)
        if shared is not None and any(shared):
            _counted_once(change, st, oc, mbs, shared, schedule.stage_to_rank)
        peaks.append(float(max(0.0, np.cumsum(change).max(initial=0.0))))
    return peaks


def _counted_once(change, stages, codes, mbs, shared, stage_to_rank) -> None:
    """Take ``shared[s]``'s bytes off ``change`` (a rank's row) from each F of a stage ``s``
    whose stage before is on the rank until the first of the two lets them go."""
    at = {(s, c, mb): k for k, (s, c, mb) in enumerate(zip(stages, codes, mbs))}
    for k, (s, c, mb) in enumerate(zip(stages, codes, mbs)):
        if c != F or s == 0 or not shared[s] or stage_to_rank[s - 1] != stage_to_rank[s]:
            continue
        nbytes, until = shared[s]
        if until == UNTIL[0]:
            ends = [(s, I), (s, B)]
        elif until == UNTIL[1]:
            ends = [(s - 1, I), (s - 1, B), (s, W), (s, B)]
        elif until == UNTIL[2]:
            ends = [(s - 1, W), (s - 1, B), (s, W), (s, B)]
        else:  # (not a time the counters give: nothing taken off, erring high)
            continue
        found = [e for e in (at.get((t, op, mb)) for t, op in ends) if e is not None and e > k]
        if found:
            change[k] -= nbytes
            change[min(found)] += nbytes
