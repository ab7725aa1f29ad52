"""Render a schedule as a rank x time grid of F/B/idle cells, from its simulated timeline."""

from __future__ import annotations

from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.sim.simulate import Costs, simulate


def render_grid(schedule: Schedule, costs: Costs | None = None, transport: str = "nccl") -> str:
    """One row per rank, one column per time slot. Costs must be whole numbers of slots.

    A cell holds ``F3`` (forward of microbatch 3), ``B3`` (backward), ``I3``/``W3`` (split
    backward) or ``.`` (idle). With several stages per rank the stage is shown too: ``2F3``.
    """
    costs = costs or Costs()
    timeline = simulate(schedule, costs, transport)
    width_slots = int(round(timeline.makespan))
    multi = schedule.num_stages > schedule.num_ranks
    labels = [[str(a) if multi else f"{a.op.value}{a.mb}" for a in (e.action for e in row)] for row in timeline.events]
    cell = max([len(x) for row in labels for x in row] + [2]) + 1
    lines = ["time   " + "".join(f"{t:<{cell}}" for t in range(width_slots))]
    for r, row in enumerate(timeline.events):
        cells = ["." for _ in range(width_slots)]
        for e, label in zip(row, labels[r]):
            start, end = int(round(e.start)), int(round(e.end))
            for t in range(start, end):
                cells[t] = label
        lines.append(f"rank {r} " + "".join(f"{c:<{cell}}" for c in cells))
    return "\n".join(line.rstrip() for line in lines)
