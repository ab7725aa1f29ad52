"""Read and write schedules in torch.distributed.pipelining's CSV form: one row per rank,
one action string per cell (``0F0,0F1,0B0,...``); empty cells are idle slots."""

from __future__ import annotations

import csv
from pathlib import Path

from ppx.errors import ScheduleError
from ppx.schedules.action import Action
from ppx.schedules.schedule import Schedule


def write_csv(schedule: Schedule, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for row in schedule.actions:
            writer.writerow([str(a) for a in row])


def read_csv(path: str | Path, name: str | None = None) -> Schedule:
    """Load a CSV schedule (compute-only or with comms); the stage-to-rank map and the
    microbatch count are inferred from the actions, and training from whether any backward
    appears. Returns the actions as written; `add_comms` fills in missing communication."""
    path = Path(path)
    try:
        with open(path, newline="") as f:
            rows = [[Action.parse(c) for c in row if c.strip()] for row in csv.reader(f)]
    except OSError as e:
        raise ScheduleError(f"cannot read schedule CSV {path}: {e.strerror}") from None
    rows = [r for r in rows]
    if not rows or not any(rows):
        raise ScheduleError(f"schedule CSV {path} holds no actions")
    owner: dict[int, int] = {}
    for r, row in enumerate(rows):
        for a in row:
            if owner.setdefault(a.stage, r) != r:
                raise ScheduleError(f"schedule CSV {path}: stage {a.stage} appears on ranks {owner[a.stage]} and {r}")
    stages = max(owner) + 1
    missing = [s for s in range(stages) if s not in owner]
    if missing:
        raise ScheduleError(f"schedule CSV {path}: stages {missing} have no actions")
    m = max(a.mb for row in rows for a in row) + 1
    training = any(a.op.is_backward for row in rows for a in row)
    return Schedule(name or path.stem, m, tuple(owner[s] for s in range(stages)), tuple(tuple(r) for r in rows), training)
