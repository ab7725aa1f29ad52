"""A schedule CSV's compute order checked as written, before ppx places its sends and
receives: each error names the file, the rank (its row) and, where one cell is wrong, the cell
(counted from 0 in that row, empty and REDUCE_GRAD cells included), where the checks of the
placed list would name a position in a list with sends and receives the file never held."""

from __future__ import annotations

from pathlib import Path

from ppx.errors import ScheduleError
from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule


def check_written(path: str | Path, schedule: Schedule, cells: list[list[int]]) -> None:
    """ScheduleError, in one line, for the first thing wrong in ``schedule`` as written
    (``cells[r][i]``: the cell of row r that holds its i-th action): a microbatch no action
    names (a CSV runs as many as its largest index + 1), an action twice, an overlapped cell of
    one microbatch, a stage without some microbatch's forward (or, training, backward), a
    backward written both whole and split, an I without its W (or a W without its I), a
    backward before its forward (or without one), a W before its I."""
    m = schedule.num_microbatches
    used = {a.mb for row in schedule.actions for a in row}
    if len(used) < m:
        one = m - len(used) == 1
        said = f"microbatch{'' if one else 'es'} {spans_missing(used, m)}"
        raise ScheduleError(
            f"schedule CSV {path}: {said} appear{'s' if one else ''} in no cell, where its largest "
            f"is {m - 1}: a CSV runs as many microbatches as its largest index + 1 ({m} here)"
        )
    for r, row in enumerate(schedule.actions):
        at: dict[Action, int] = {}  # each action -> its index in the row
        for i, a in enumerate(row):
            if a in at:
                raise ScheduleError(
                    f"{_cell(path, r, cells[r][i], a)}: {a} is written twice (cells {cells[r][at[a]]} and {cells[r][i]})"
                )
            if i and cells[r][i - 1] == cells[r][i] and (row[i - 1].stage, row[i - 1].mb) == (a.stage, a.mb):
                raise ScheduleError(
                    f"{_cell(path, r, cells[r][i], a)}: an overlapped cell holds a forward and a backward of two "
                    f"microbatches, not {row[i - 1]} and its own backward"
                )
            at[a] = i
        for i, a in enumerate(row):
            where = _cell(path, r, cells[r][i], a)
            twin = a._replace(op=Op.B if a.op is not Op.B else Op.I)
            if a.op in (Op.I, Op.W) and twin in at:
                raise ScheduleError(
                    f"{where}: microbatch {a.mb}'s backward on stage {a.stage} is written both whole ({twin}) "
                    "and split (an I and its W): one or the other"
                )
            forward = a._replace(op=Op.F)
            if a.op in (Op.B, Op.I) and forward not in at:
                raise ScheduleError(f"{where}: {a} has no forward {forward} on this rank")
            if a.op in (Op.B, Op.I) and at[forward] > i:
                raise ScheduleError(f"{where}: backward before its forward {forward} (cell {cells[r][at[forward]]})")
            if a.op is Op.I and a._replace(op=Op.W) not in at:
                raise ScheduleError(f"{where}: {a} has no {a._replace(op=Op.W)}: an I's weight gradients come in its W")
            if a.op is Op.W:
                i_ = a._replace(op=Op.I)
                if i_ not in at:
                    raise ScheduleError(f"{where}: {a} has no {i_}: a W follows its input gradient's I")
                if at[i_] > i:
                    raise ScheduleError(
                        f"{where}: weight gradient before its input gradient {i_} (cell {cells[r][at[i_]]})"
                    )
        _every_microbatch(path, schedule, r, at)


def _every_microbatch(path, schedule: Schedule, r: int, at: dict) -> None:
    """Each stage of row ``r`` runs every microbatch's forward, and when training its backward
    (a B, or an I: whose W `check_written` asks for)."""
    m = schedule.num_microbatches
    for stage in sorted({a.stage for a in at}):
        for mb in range(m):
            forward = Action(stage, Op.F, mb)
            if forward not in at:
                raise ScheduleError(
                    f"schedule CSV {path}: rank {r}: stage {stage} has no forward of microbatch {mb} ({forward})"
                )
            if schedule.training and Action(stage, Op.B, mb) not in at and Action(stage, Op.I, mb) not in at:
                raise ScheduleError(
                    f"schedule CSV {path}: rank {r}: stage {stage} has no backward of microbatch {mb} "
                    f"({stage}B{mb}, or {stage}I{mb} and {stage}W{mb})"
                )


def _cell(path, r: int, cell: int, a: Action) -> str:
    return f"schedule CSV {path}: rank {r} cell {cell} ({a})"


def spans_missing(present: set[int], n: int, most: int = 8) -> str:
    """The numbers of 0..n-1 not in ``present``, as runs (``3-8, 11``; the first ``most`` runs
    and how many more), found from the present ones: a cell's index of 10^9 costs no list of
    10^9."""
    runs, start = [], 0
    for k in sorted(present) + [n]:
        if k > start:
            runs.append(str(start) if k == start + 1 else f"{start}-{k - 1}")
        start = max(start, k + 1)
    return ", ".join(runs[:most]) + (f" and {len(runs) - most} more runs" if len(runs) > most else "")
