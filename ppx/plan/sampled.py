"""A candidate's costs drawn from a run's measured samples (summary.json's ``cost_samples``),
so that a ``--from-run`` plan predicts the expected step, as the run's own report does: the
step of the mean costs comes out short, since a slow action on the critical path costs all of
its delay and one off it none.

The run's stages map onto a candidate's as `PlanInputs.parts` maps them: a candidate stage
draws each run stage it takes a share of and adds those shares (a whole run stage, 1/v of one
cut into v parts, or k of its n model units). An op the run did not measure is made of the ones it did: a full
backward B from an I and a W; an I from a B (the run's W unmeasured is 0), as the means do.
A candidate's microbatch 0 draws the run's microbatch 0 samples (``first_s``), the step's first
of their kind, which cost more, as the run's own prediction draws them.
"""

from __future__ import annotations

import random
from statistics import fmean

from ppx.measure.prediction import DRAWS
from ppx.schedules.ir.action import Action
from ppx.schedules.sim.costs import REDUCE, split_first


class PlanSamples:
    """`ppx.schedules.sim.costs.SampledCosts`' interface over a run's samples, for a candidate
    whose stages are ``parts`` of the run's (`PlanInputs.parts`)."""

    def __init__(
        self,
        samples: dict,
        parts: list[tuple],
        seed: int = 0,
        reduce_parts: list[tuple] | None = None,
        whole: set[int] = frozenset(),
        first: dict | None = None,
    ):
        self._actions = samples["action_s"]
        self._first = first or {}  # microbatch 0's samples, ``action_s`` the others' (`split_first`)
        self._whole = whole  # candidate stages run whole: an I draws a B, a W nothing
        self._parts = parts  # per candidate stage: (run stage, numerator, denominator) of its shares
        self._reduce_parts = reduce_parts or parts  # the reduction's, by parameter bytes (`PlanInputs.parts`)
        self._p2p = samples["p2p_s"] or [0.0]
        self._overhead = samples["overhead_s"] or [0.0]
        self._send_post = samples.get("send_post_s") or [0.0]
        self._recv_post = samples.get("recv_post_s") or [0.0]
        self._rng = random.Random(seed)

    def _draw(self, unit: int, op: str, first: bool = False) -> float:
        key = f"{unit}{op}"
        got = (first and self._first.get(key)) or self._actions.get(key)
        if got:
            return self._rng.choice(got)
        if op == "B" and f"{unit}I" in self._actions:
            return self._draw(unit, "I", first) + self._draw(unit, "W", first)
        if op == "I" and f"{unit}B" in self._actions:
            return self._draw(unit, "B", first)
        return 0.0

    def _of_stage(self, stage: int, op: str, parts: list[tuple] | None = None, first: bool = False) -> float:
        return sum(self._draw(u, op, first) * k / n for u, k, n in (parts or self._parts)[stage])

    def work(self, a: Action) -> float:
        if not a.op.is_compute:
            return 0.0
        op = a.op.value
        if a.stage in self._whole and op in "IW":
            if op == "W":
                return 0.0
            op = "B"
        return self._of_stage(a.stage, op, first=a.mb == 0)

    def reduce_cost(self, stage: int) -> float:
        return self._of_stage(stage, REDUCE, self._reduce_parts)

    def after(self, a: Action) -> float:
        return self._rng.choice(self._overhead)

    def latency(self) -> float:
        return self._rng.choice(self._p2p)

    def post_cost(self, a: Action) -> float:
        return self._rng.choice(self._send_post if a.op.is_send else self._recv_post)


def expected(
    simulate_once,
    samples: dict,
    parts: list[tuple],
    reduce_parts: list[tuple] | None = None,
    whole: set[int] = frozenset(),
) -> tuple[float, float, float]:
    """(mean step, mean bubble, mean steady-state step) of ``simulate_once(costs)`` over `DRAWS`
    draws of the samples (``reduce_parts``: the data-parallel reduction's shares, else ``parts``;
    ``whole``: the candidate's stages priced as run whole)."""
    first, later = _split(samples)
    apart = {**samples, "action_s": later}
    runs = [simulate_once(PlanSamples(apart, parts, seed, reduce_parts, whole, first)) for seed in range(DRAWS)]
    return fmean(t.makespan for t in runs), fmean(t.bubble_fraction() for t in runs), fmean(t.steady() for t in runs)


_SPLITS: dict = {}  # (id of action_s, id of first_s) -> (action_s, first_s, split): one per samples a process plans from


def _split(samples: dict) -> tuple[dict, dict]:
    """`split_first` of ``samples``, made once per samples dict (every candidate of a plan
    draws from the same), not once per candidate."""
    actions, first = samples["action_s"], samples.get("first_s")
    hit = _SPLITS.get((id(actions), id(first)))
    if hit is None or hit[0] is not actions or hit[1] is not first:
        if len(_SPLITS) >= 8:
            _SPLITS.clear()
        hit = _SPLITS[(id(actions), id(first))] = (actions, first, split_first(actions, first))
    return hit[2]
