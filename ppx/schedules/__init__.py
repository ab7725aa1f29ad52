"""Schedules as data: pure functions from (stages, microbatches) to per-rank action lists.

`build(name, stages, microbatches)` looks a schedule up in `FAMILIES`, adds the sends and
receives it implies and validates it; the runtime, the grid, the simulator and the measured
timeline all read the resulting `Schedule`. Adding a schedule = one pure function + one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ppx.errors import ScheduleError
from ppx.schedules.action import Action, Op
from ppx.schedules.basic import forward_only, gpipe, naive, one_f_one_b
from ppx.schedules.csv_io import read_csv, write_csv
from ppx.schedules.lowering import add_comms
from ppx.schedules.schedule import Schedule
from ppx.schedules.simulate import Costs, Timeline, simulate
from ppx.schedules.validate import validate

__all__ = [
    "Action", "Op", "Schedule", "Costs", "Timeline", "FAMILIES", "Family", "build", "from_csv",
    "validate", "simulate", "add_comms", "read_csv", "write_csv", "theory_bubble",
]


@dataclass(frozen=True)
class Family:
    """A named schedule: its pure builder, its theoretical bubble and a one-line summary."""

    name: str
    make: Callable[[int, int], Schedule]
    bubble: Callable[[int, int], float]  # share of the step time that is idle, uniform costs
    bubble_formula: str
    summary: str


def _fill_drain(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("naive", naive, lambda p, m: (p - 1) / p, "(p-1)/p", "one microbatch at a time through all stages, stop-and-wait"),
        Family("gpipe", gpipe, _fill_drain, "(p-1)/(m+p-1)", "all forwards, then all backwards"),
        Family("1f1b", one_f_one_b, _fill_drain, "(p-1)/(m+p-1)", "warmup forwards, one-forward-one-backward, cooldown"),
        Family("forward_only", forward_only, _fill_drain, "(p-1)/(m+p-1)", "forwards only (inference/evaluation)"),
    ]
}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; choose from {', '.join(FAMILIES)}") from None


def build(name: str, stages: int, microbatches: int) -> Schedule:
    """The validated schedule ``name`` for ``stages`` ranks and ``microbatches``, with comms."""
    if stages < 1 or microbatches < 1:
        raise ScheduleError(f"stages ({stages}) and microbatches ({microbatches}) must be >= 1")
    schedule = add_comms(family(name).make(stages, microbatches))
    validate(schedule)
    return schedule


def from_csv(path: str | Path) -> Schedule:
    """Load, complete (comms) and validate a schedule written as torch-style CSV."""
    loaded = read_csv(path)
    has_comms = any(a.op.is_comm for row in loaded.actions for a in row)
    schedule = loaded if has_comms else add_comms(loaded)
    validate(schedule)
    return schedule


def theory_bubble(name: str, stages: int, microbatches: int) -> float | None:
    """Theoretical bubble as a share of the step, or None for schedules without a formula."""
    fam = FAMILIES.get(name)
    return fam.bubble(stages, microbatches) if fam else None
