"""A schedule's activation memory, predicted: what each rank holds over a step, from the
bytes one microbatch's forward saves on each stage (the zero-bubble paper's accounting).

Walking a rank's actions in order: F adds the stage's bytes of one microbatch; I frees the
share only the input gradient needed (``input_share``); W frees the rest; B frees all. The
peak of that running sum is the rank's peak saved activations. ppx's runtime keeps a split
backward's whole graph from I until W (W differentiates the same graph), so its I frees
nothing: ``input_share`` = 0, the default.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppx.schedules.ir.action import Op
from ppx.schedules.ir.schedule import Schedule


def peak_held(
    schedule: Schedule, per_microbatch: Sequence[float], input_share: float | Sequence[float] = 0.0
) -> list[float]:
    """Each rank's predicted peak saved bytes. ``per_microbatch[s]``: bytes one microbatch's
    forward saves on stage ``s``; ``input_share``: the part of them an I frees (one value
    or one per stage)."""
    shares = [input_share] * schedule.num_stages if isinstance(input_share, (int, float)) else list(input_share)
    peaks = []
    for row in schedule.actions:
        live = peak = 0.0
        for a in row:
            b = per_microbatch[a.stage]
            if a.op is Op.F:
                live += b
            elif a.op is Op.B:
                live -= b
            elif a.op is Op.I:
                live -= shares[a.stage] * b
            elif a.op is Op.W:
                live -= (1 - shares[a.stage]) * b
            peak = max(peak, live)
        peaks.append(peak)
    return peaks
