"""What actions and messages cost, for the simulator: fixed per-stage `Costs`, or
`SampledCosts` drawn from a run's measured samples."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ppx.schedules.ir.action import Action, Op

PerStage = float | Sequence[float]
REDUCE = "REDUCE_GRAD"  # a stage's data-parallel reduction among measured samples: "<stage>REDUCE_GRAD"


def _per_stage(value: PerStage, stage: int) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    return float(value[stage])


@dataclass(frozen=True)
class Costs:
    """Per-action costs in seconds (or any unit). ``fwd``/``bwd``/``wgrad`` are one value
    or one per stage. A full backward B costs bwd + wgrad, an input-gradient backward I costs
    bwd and a weight-gradient backward W costs wgrad. ``p2p`` is the latency of one message
    from its post; ``send_post``/``recv_post`` the time to post one send/receive (a batch's
    ops are posted one after another from the end of the compute before it, each out when its
    own posting ends); ``overhead`` is added to every compute action: the runtime's own time
    around it besides posting; ``reduce`` (one value or per stage) is a stage's data-parallel
    gradient reduction. ``whole`` (None, or per stage a value or None) is what a B costs on a
    stage whose list also splits backwards (``train.split_backward=drain``), measured apart:
    a split's I + W costs more than the whole backward it replaces."""

    fwd: PerStage = 1.0
    bwd: PerStage = 1.0
    wgrad: PerStage = 0.0
    p2p: float = 0.0
    overhead: float = 0.0
    send_post: float = 0.0
    recv_post: float = 0.0
    reduce: PerStage = 0.0
    whole: Sequence[float | None] | None = None

    def reduce_cost(self, stage: int) -> float:
        return _per_stage(self.reduce, stage)

    def run_whole(self, stages, num_stages: int) -> Costs:
        """These costs where ``stages`` (of ``num_stages``) run each backward whole, in the I (ppx's
        runtime on a stage whose every I its list follows at once by its W): an I costs a B
        (``whole``'s where measured, else I + W), a W nothing."""
        if not stages:
            return self
        b = [self.work(Action(s, Op.B, 0)) for s in range(num_stages)]
        bwd = [b[s] if s in stages else _per_stage(self.bwd, s) for s in range(num_stages)]
        wgrad = [0.0 if s in stages else _per_stage(self.wgrad, s) for s in range(num_stages)]
        return replace(self, bwd=bwd, wgrad=wgrad)

    def of(self, a: Action) -> float:
        """The action's work plus the runtime's overhead after it."""
        return self.work(a) + self.after(a) if a.op.is_compute else 0.0

    def work(self, a: Action) -> float:
        s = a.stage
        if a.op is Op.F:
            return _per_stage(self.fwd, s)
        if a.op is Op.B:
            if self.whole is not None and self.whole[s] is not None:
                return float(self.whole[s])
            return _per_stage(self.bwd, s) + _per_stage(self.wgrad, s)
        if a.op is Op.I:
            return _per_stage(self.bwd, s)
        if a.op is Op.W:
            return _per_stage(self.wgrad, s)
        return 0.0

    def after(self, a: Action) -> float:
        return self.overhead

    def latency(self) -> float:
        return self.p2p

    def post_cost(self, a: Action) -> float:
        return self.send_post if a.op.is_send else self.recv_post


def split_first(actions: dict, first: dict | None) -> tuple[dict, dict]:
    """(microbatch 0's samples, the others) per "<stage><op>" of ``actions`` (every sample of
    each key), where ``first`` holds microbatch 0's among them (a run's ``first_s``). A first
    sample counts only where ``actions`` holds it (one occurrence each, taken out of the
    others): one left out of ``actions`` as a stall is left out of both. A key without first
    samples is drawn from its whole list. ``first`` must be of the same run's lists (their
    callers drop it where they put another run's lists in their place: values are matched)."""
    firsts, later = {}, {}
    for key, values in actions.items():
        if not (first or {}).get(key):
            later[key] = values
            continue
        held = Counter(values)
        mine = [x for x in first[key] if _take(held, x)]
        if not mine or len(mine) == len(values):  # (no first, or nothing but firsts: one list)
            later[key] = values
            continue
        firsts[key] = mine
        taken = Counter(mine)
        later[key] = [x for x in values if not _take(taken, x)]
    return firsts, later


def with_actions(samples: dict, actions: dict) -> dict:
    """``samples`` (a run's `cost_samples`) with ``actions`` as its compute samples, lists
    another run measured (a ``run.paired`` entry's): without the run's microbatch 0 samples,
    which are of its own lists (`split_first` matches values)."""
    return {**{k: v for k, v in samples.items() if k != "first_s"}, "action_s": actions}


def _take(counts: Counter, x) -> bool:
    """Take one ``x`` out of ``counts``: whether there was one."""
    if counts[x] > 0:
        counts[x] -= 1
        return True
    return False


class SampledCosts:
    """Costs drawn afresh for every action and message from measured samples: ``actions``
    maps "<stage><op>" (e.g. "0F", "1B") to durations, ``p2p``, ``overhead``, ``send_post``
    and ``recv_post`` are lists; "<stage>REDUCE_GRAD" holds a stage's data-parallel reductions.
    ``first`` (`split_first`), by the same keys, the samples microbatch 0's action draws, a
    step's first of its kind on its stage, which costs more than the others (``actions`` then
    holds the others). Simulating many draws gives the expected step time under the measured
    variability, which the step time of the mean costs underestimates (a slow action on the
    critical path costs all of its delay, one off it none)."""

    def __init__(
        self,
        actions: dict,
        p2p: Sequence[float],
        overhead: Sequence[float],
        seed: int = 0,
        send_post: Sequence[float] = (),
        recv_post: Sequence[float] = (),
        first: dict | None = None,
    ):
        self._samples = {k: list(v) for k, v in actions.items()}
        self._first = first or {}
        self._p2p, self._overhead = list(p2p) or [0.0], list(overhead) or [0.0]
        self._send_post, self._recv_post = list(send_post) or [0.0], list(recv_post) or [0.0]
        self._rng = random.Random(seed)

    def work(self, a: Action) -> float:
        key = f"{a.stage}{a.op.value}"
        got = (a.mb == 0 and self._first.get(key)) or self._samples.get(key)
        return self._rng.choice(got) if got else 0.0

    def reduce_cost(self, stage: int) -> float:
        got = self._samples.get(f"{stage}{REDUCE}")
        return self._rng.choice(got) if got else 0.0

    def after(self, a: Action) -> float:
        return self._rng.choice(self._overhead)

    def latency(self) -> float:
        return self._rng.choice(self._p2p)

    def post_cost(self, a: Action) -> float:
        return self._rng.choice(self._send_post if a.op.is_send else self._recv_post)
