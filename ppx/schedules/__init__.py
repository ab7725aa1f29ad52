"""Schedules as data: pure functions from (stages, microbatches, v) to per-rank action lists.

`registry.build(name, p, m, v)` looks a schedule up, adds the sends and receives it implies
and validates it; the runtime, the grid, the simulator and the measured timeline all read the
resulting `Schedule`. Adding a schedule = one pure function + one entry in `registry`.
"""

from __future__ import annotations

from ppx.schedules.comms.lowering import add_comms
from ppx.schedules.csv_io import from_csv, read_csv, write_csv
from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.placing.validate import validate
from ppx.schedules.registry import (
    FAMILIES,
    TORCH_SCHEDULES,
    Family,
    build,
    default_virtual,
    drained,
    family,
    family_name,
    formula_family,
    is_csv,
    is_torch,
    runs_on_torch,
    theory_bubble,
    virtual_stages_error,
)
from ppx.schedules.sim.costs import Costs, SampledCosts
from ppx.schedules.sim.simulate import Timeline, simulate

__all__ = [
    "Action",
    "Op",
    "Schedule",
    "Costs",
    "SampledCosts",
    "Timeline",
    "FAMILIES",
    "TORCH_SCHEDULES",
    "Family",
    "build",
    "default_virtual",
    "drained",
    "family",
    "family_name",
    "formula_family",
    "from_csv",
    "is_csv",
    "is_torch",
    "runs_on_torch",
    "validate",
    "simulate",
    "add_comms",
    "read_csv",
    "write_csv",
    "theory_bubble",
    "virtual_stages_error",
]
