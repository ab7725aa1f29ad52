"""One candidate's numbers: its schedule simulated on the plan's costs (step time, bubble)
and its memory predicted (`ppx.schedules.sim.memory.peak_held` of the saved activations, plus
the params of the stages each rank holds)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ppx.errors import ScheduleError
from ppx.plan.builders import build
from ppx.plan.inputs import MeasuredAt, PlanInputs
from ppx.plan.sampled import expected
from ppx.plan.space import Candidate, Skipped
from ppx.schedules.ir.structure import split_stages, whole_stages_of
from ppx.schedules.sim.memory import peak_held
from ppx.schedules.sim.simulate import simulate


@dataclass(frozen=True)
class Result:
    """A candidate evaluated: ``step_s`` predicted synchronous step (seconds: every rank
    starting together, what `ppx run` measures), ``bubble`` idle share of it, ``peak_bytes``
    each rank's predicted peak (activations + params), ``fits`` the budget; ``steady_s`` the
    steady-state step (the longest rank's own span: consecutive steps with no rank waiting at
    a step boundary, the zero-bubble paper's cost); ``rank_by`` which of the two ranks it;
    ``timed_by``: the run.paired entries whose actions at its stage count timed it (none: the
    run's own costs, regrouped where its stages are more); ``sized``: whether any bytes were
    given (activations or parameters: else every peak is 0 and says nothing), ``budgeted``
    whether a budget was (else every candidate fits, and that says nothing either)."""

    schedule: str
    p: int
    m: int
    v: int
    step_s: float
    bubble: float
    peak_bytes: tuple[float, ...]
    fits: bool
    steady_s: float = 0.0
    rank_by: str = "sync"
    timed_by: tuple[str, ...] = ()
    sized: bool = True
    budgeted: bool = True

    @property
    def ranked_s(self) -> float:
        """The step the ranking uses: ``step_s`` (sync) or ``steady_s`` (steady)."""
        return self.steady_s if self.rank_by == "steady" else self.step_s

    @property
    def peak_max(self) -> float:
        """The busiest rank's peak, bytes."""
        return max(self.peak_bytes)

    @property
    def throughput(self) -> float:
        """Microbatches per second at the ranked step."""
        return self.m / self.ranked_s

    def label(self) -> str:
        return f"{self.schedule} p={self.p} m={self.m} v={self.v}"

    def to_json(self) -> dict:
        return {**asdict(self), "peak_max_bytes": self.peak_max, "microbatches_per_s": self.throughput}


def measured_for(sched, inputs: PlanInputs, whole: set[int]) -> MeasuredAt | None:
    """What an entry measured at ``sched``'s stage count that times it (its ``whole`` stages run
    whole; `PlanInputs.measured_for`), or None: the run's own costs time it."""
    return inputs.measured_for(sched.num_stages, split_stages(sched) - whole)


def timed_by_an_entry(name: str, p: int, m: int, v: int, inputs: PlanInputs) -> bool:
    """Whether candidate ``name`` at (p, m, v) is timed on what an entry measured at its stage
    count (`measured_for`), as its command runs it (`PlanInputs.runs_whole`)."""
    try:
        sched = build(name, p, m, v, inputs)
    except ScheduleError:
        return False
    return measured_for(sched, inputs, whole_stages_of(sched) if inputs.runs_whole else set()) is not None


def evaluate(c: Candidate, inputs: PlanInputs) -> Result | Skipped:
    """Simulate and size candidate ``c``; a shape the builder refuses comes back Skipped."""
    try:
        sched = build(c.schedule, c.p, c.m, c.v, inputs)
    except ScheduleError as e:
        return Skipped(c.schedule, c.p, c.m, c.v, str(e))
    n = sched.num_stages
    reduce = inputs.reduce_s is not None
    whole = whole_stages_of(sched) if inputs.runs_whole else set()  # (as its command runs them)
    found = measured_for(sched, inputs, whole)
    timed = inputs if found is None else inputs.timed_on(found)
    priced = whole - timed.ran_whole(n)  # (a stage the run ran whole too is priced as it ran)
    if timed.samples:  # a run's: the expected step over draws of its measured costs
        once = lambda costs: simulate(sched, costs, timed.transport, timed.lookahead, reduce)  # noqa: E731
        step, bubble, steady = expected(once, timed.samples, timed.parts(n), timed.parts(n, "params"), priced)
    else:
        t = simulate(sched, timed.costs(n, priced), timed.transport, timed.lookahead, reduce)
        step, bubble, steady = t.makespan, t.bubble_fraction(), t.steady()
    params = inputs.params(n)
    shares = [1.0 if s in whole else x for s, x in enumerate(inputs.shares(n))]  # (a whole I frees it all)
    held = peak_held(sched, inputs.act(n), shares, inputs.shared(n))
    peaks = tuple(
        held[r] + sum(params[s] for s, owner in enumerate(sched.stage_to_rank) if owner == r)
        for r in range(sched.num_ranks)
    )
    fits = inputs.budget_bytes is None or max(peaks) <= inputs.budget_bytes
    by = found.sources if found else ()
    sized = inputs.act_bytes is not None or inputs.param_bytes is not None
    budgeted = inputs.budget_bytes is not None
    return Result(c.schedule, c.p, c.m, c.v, step, bubble, peaks, fits, steady, inputs.rank_by, by, sized, budgeted)
