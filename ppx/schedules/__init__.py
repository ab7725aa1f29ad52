"""Schedules as data: pure functions from (stages, microbatches) to per-rank action lists.

`build(name, stages, microbatches)` looks a schedule up in `FAMILIES`, adds the sends and
receives it implies and validates it; the runtime, the grid, the simulator and the measured
timeline all read the resulting `Schedule`. Adding a schedule = one pure function + one entry.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ppx.errors import ScheduleError
from ppx.schedules.action import Action, Op
from ppx.schedules.basic import forward_only, gpipe, naive, one_f_one_b
from ppx.schedules.interleaved import interleaved_1f1b
from ppx.schedules.csv_io import read_csv, write_csv
from ppx.schedules.lowering import add_comms
from ppx.schedules.schedule import Schedule
from ppx.schedules.simulate import Costs, SampledCosts, Timeline, simulate
from ppx.schedules.validate import validate
from ppx.schedules.zero_bubble import zb_h1

__all__ = [
    "Action", "Op", "Schedule", "Costs", "SampledCosts", "Timeline", "FAMILIES", "Family", "build", "from_csv",
    "validate", "simulate", "add_comms", "read_csv", "write_csv", "theory_bubble", "formula_family",
]


@dataclass(frozen=True)
class Family:
    """A named schedule: its pure builder (p, m, v), its theoretical bubble (share of the
    step that is idle, with equal per-stage costs) and a one-line summary."""

    name: str
    make: Callable[[int, int, int], Schedule]
    bubble: Callable[[int, int, int], float]
    bubble_formula: str
    summary: str
    virtual: bool = False  # accepts pipeline.virtual_stages > 1


def _fill_drain(p: int, m: int, v: int = 1) -> float:
    return (p - 1) / (m + p - 1)


def _zb_h1_bubble(p: int, m: int, v: int = 1) -> float:
    """ZB-H1's idle share with t_f = t_b = t_w: (p-1)/(3m+p-1) once m >= p (simulated, so
    it also holds for m < p)."""
    return simulate(add_comms(zb_h1(p, m)), Costs(fwd=1, bwd=1, wgrad=1)).bubble_fraction()


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("naive", lambda p, m, v: naive(p, m), lambda p, m, v=1: (p - 1) / p, "(p-1)/p",
               "one microbatch at a time through all stages, stop-and-wait"),
        Family("gpipe", lambda p, m, v: gpipe(p, m), _fill_drain, "(p-1)/(m+p-1)", "all forwards, then all backwards"),
        Family("1f1b", lambda p, m, v: one_f_one_b(p, m), _fill_drain, "(p-1)/(m+p-1)",
               "warmup forwards, one-forward-one-backward, cooldown"),
        Family("forward_only", lambda p, m, v: forward_only(p, m), _fill_drain, "(p-1)/(m+p-1)",
               "forwards only (inference/evaluation)"),
        Family("interleaved_1f1b", interleaved_1f1b, lambda p, m, v=1: (p - 1) / (v * m + p - 1), "(p-1)/(vm+p-1)",
               "v stages per rank (Megatron virtual pipeline), 1F1B over model chunks", virtual=True),
        Family("zb_h1", lambda p, m, v: zb_h1(p, m), _zb_h1_bubble, "(p-1)/(3m+p-1) for m >= p, t_f = t_b = t_w",
               "1F1B with the backward split into I and W, W deferred into the bubbles"),
    ]
}


# torch.distributed.pipelining's schedules -> the ppx family whose list describes the same order
TORCH_SCHEDULES = {"torch_gpipe": "gpipe", "torch_1f1b": "1f1b", "torch_interleaved1f1b": "interleaved_1f1b"}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; choose from {', '.join(FAMILIES)}, "
                            f"or torch.distributed.pipelining's {', '.join(TORCH_SCHEDULES)}") from None


def build(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """The validated schedule ``name`` for ``stages`` ranks, ``microbatches`` and
    ``virtual_stages`` stages per rank, with comms."""
    if stages < 1 or microbatches < 1 or virtual_stages < 1:
        raise ScheduleError(
            f"stages ({stages}), microbatches ({microbatches}) and virtual stages ({virtual_stages}) must be >= 1"
        )
    fam = family(name)
    if virtual_stages != 1 and not fam.virtual:
        raise ScheduleError(f"schedule {name!r} runs one stage per rank: pipeline.virtual_stages must be 1 "
                            f"(got {virtual_stages}); interleaved_1f1b takes several")
    schedule = add_comms(fam.make(stages, microbatches, virtual_stages))
    validate(schedule)
    return schedule


def from_csv(path: str | Path) -> Schedule:
    """Load, complete (comms) and validate a schedule written as torch-style CSV."""
    loaded = read_csv(path)
    for r, row in enumerate(loaded.actions):  # as written, before the comms it implies are added
        counts = Counter(row)
        for k, a in enumerate(row):
            if counts[a] > 1:
                raise ScheduleError(f"schedule CSV {path}: rank {r} step {k} ({a}): {a} appears {counts[a]} times")
    has_comms = any(a.op.is_comm for row in loaded.actions for a in row)
    schedule = loaded if has_comms else add_comms(loaded)
    validate(schedule)
    return schedule


def formula_family(name: str) -> Family | None:
    """The family whose closed form describes schedule ``name`` (torch's via the ppx list of
    the same order), or None (a CSV schedule)."""
    return FAMILIES.get(TORCH_SCHEDULES.get(name, name))


def theory_bubble(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> float | None:
    """Theoretical bubble as a share of the step (equal stage costs), or None for schedules
    without a formula."""
    fam = formula_family(name)
    return fam.bubble(stages, microbatches, virtual_stages) if fam else None
