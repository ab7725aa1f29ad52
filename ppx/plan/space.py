"""The space a plan searches: schedule x p x m x v. A family that takes any number of stages
per rank (``virtual=True``) is tried at every v asked; a fixed-v family (the V placements:
2) at its own; the rest at 1. Shapes a family refuses are kept with the reason."""

from __future__ import annotations

from dataclasses import dataclass

from ppx.errors import ScheduleError, UserError
from ppx.plan.builders import AUTO, DRAIN, family_of
from ppx.plan.inputs import PlanInputs
from ppx.schedules.registry import FAMILIES, size_error
from ppx.units import stage_list

SPLIT_REASON = (  # a skipped shape's reason
    "I and W not measured apart where it splits (the run's backward there was whole: B, or I and W at once)"
)


@dataclass(frozen=True)
class Candidate:
    schedule: str
    p: int
    m: int
    v: int

    def label(self) -> str:
        return f"{self.schedule} p={self.p} m={self.m} v={self.v}"


@dataclass(frozen=True)
class Skipped:
    """A shape not planned, and why; p/m/v None: every shape of the schedule."""

    schedule: str
    p: int | None
    m: int | None
    v: int | None
    reason: str


def all_names() -> list[str]:
    """Every schedule a plan can try: the training families, then the automatic one."""
    return [n for n in FAMILIES if n != "forward_only"] + [AUTO]


def schedule_names(text: str) -> list[str]:
    """'all' or 'a,b,...' -> schedule names; an unknown one is a UserError."""
    if text.strip() == "all":
        return all_names()
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in all_names()]
    if unknown:
        raise UserError(
            f"--schedules: unknown {', '.join(map(repr, unknown))}; choose all or from {', '.join(all_names())}"
        )
    return list(dict.fromkeys(names))


def splits(name: str) -> bool:
    """Whether a schedule splits its backward into I and W (zb_auto does where W costs time)."""
    if name == AUTO:
        return True
    fam = FAMILIES[family_of(name)]
    sched = fam.make(2, 4, fam.default_virtual if not fam.virtual else 2)
    return sched.splits_backward


def _apart(name: str, p: int, m: int, v: int, inputs: PlanInputs) -> str | None:
    """Why a candidate is refused where it splits apart a stage the run ran whole (its I and
    W not measured apart), or None; zb_auto's order is known only once it is built."""
    from ppx.schedules import build
    from ppx.schedules.ir.structure import split_apart

    whole = stage_list(inputs.whole_stages)
    if name == AUTO:
        return SPLIT_REASON + f": {whole} ran whole, zb_auto's order is not known"
    if p * v != inputs.stages:  # its stages cut the run's otherwise: a whole stage's layers land in split ones
        return SPLIT_REASON + f": {whole} ran whole, and {p * v} stages cut the run's {inputs.stages} otherwise"
    try:
        built = build(family_of(name), p, m, v, inputs.transport)
    except ScheduleError as e:  # (a list past what ppx builds: refused as the run would refuse it)
        return str(e)
    apart = split_apart(built, inputs.whole_stages)
    if apart:
        return SPLIT_REASON + f": it splits {stage_list(apart)}, which the run ran whole"
    return None


def timed_at_its_count(name: str, p: int, m: int, v: int, inputs: PlanInputs) -> bool:
    """Whether an entry beside the run measured the candidate's stage count, its I and W where
    it splits them apart (`ppx.plan.evaluate.timed_by_an_entry`): the run's own I, W and whole
    stages then do not price it, nor are its stages the run's regrouped."""
    if name == AUTO or not inputs.measured_at or p * v == inputs.stages:
        return False
    from ppx.plan.evaluate import timed_by_an_entry

    return timed_by_an_entry(name, p, m, v, inputs)


def shapes(name: str, vs: list[int]) -> list[int]:
    """The v values a schedule is tried at."""
    if name == AUTO:
        return [1]
    fam = FAMILIES[family_of(name)]
    return list(vs) if fam.virtual else [fam.default_virtual]


def candidates(
    names: list[str], ps: list[int], ms: list[int], vs: list[int], inputs: PlanInputs
) -> tuple[list[Candidate], list[Skipped]]:
    """Every candidate of the space, and the shapes skipped with their reasons (a family's
    shape rule, a list larger than ppx builds, or stages the costs cannot be split into). From a run that measured its B's
    apart from its I and W (``train.split_backward=drain``), each family that splits its
    backward is tried as drain runs it too (``<name>+drain``)."""
    out, skipped = [], []
    if inputs.whole_s is not None:
        names = [x for n in names for x in ([n, n + DRAIN] if n != AUTO and splits(n) else [n])]
    for name in names:
        for p in ps:
            for m in ms:
                for v in shapes(name, vs):
                    why = None if name == AUTO else FAMILIES[family_of(name)].shape_error(p, m, v)
                    why = why or size_error(p, v, m) or inputs.why_not(p * v)
                    # (an entry ran its stage count, its I and W among it: the run's own do not price it)
                    own = not why and splits(name) and not timed_at_its_count(name, p, m, v, inputs)
                    if own and not inputs.split_known:
                        why = SPLIT_REASON + ": its I and W costs are unknown"
                    if own and not why and inputs.whole_stages:
                        why = _apart(name, p, m, v, inputs)
                    if why:
                        skipped.append(Skipped(name, p, m, v, why))
                    else:
                        out.append(Candidate(name, p, m, v))
    return out, skipped
