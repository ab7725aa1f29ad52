"""Read and write schedules in torch.distributed.pipelining's CSV form: one row per rank,
one action string per cell (``0F0,0F1,0B0,...``); empty cells are idle slots.

torch's runtime (``_PipelineScheduleRuntime``) also schedules per-stage bookkeeping actions:
``{stage}REDUCE_GRAD`` after a stage's last B or W and that backward's gradient send,
where torch's own lowering puts it (it scales the accumulated gradients by 1/microbatches;
placed before the send, it would hold the send back), and ``UNSHARD``/``RESHARD`` for FSDP.
A CSV with comms, which torch loads as is, must carry REDUCE_GRAD, so `write_csv` adds it
there; `read_csv` skips all three (ppx scales the loss by 1/microbatches instead and does no FSDP)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from ppx.errors import ScheduleError
from ppx.files import write_whole
from ppx.schedules.csv_checks import check_written, spans_missing
from ppx.schedules.ir.action import parse_cell
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.placing.placement import place_comms
from ppx.schedules.placing.validate import validate
from ppx.schedules.registry import too_many

TORCH_ONLY = ("REDUCE_GRAD", "UNSHARD", "RESHARD")


def torch_rows(schedule: Schedule) -> list[list[str]]:
    """The action strings per rank as torch's runtime expects them: with comms, a
    REDUCE_GRAD per stage when training, after the stage's last B/W and its last gradient
    send (torch's lowering appends it after the backward's send: `_add_reduce_grad`, then
    `_add_send_recv`), so no send waits for the reduction."""
    with_comms = any(a.op.is_comm for row in schedule.actions for a in row)
    rows = []
    for r, row in enumerate(schedule.actions):
        last = {}
        if with_comms and schedule.training:
            last = {a.stage: k for k, a in enumerate(row) if a.op.value in ("B", "W", "SEND_B")}
        out, k = [], 0  # k: the unit's position in the row
        for unit, text in zip(schedule.units(r), schedule.strings(r)):  # an overlapped cell: one string
            out.append(text)
            out += [f"{a.stage}REDUCE_GRAD" for j, a in enumerate(unit, k) if last.get(a.stage) == j]
            k += len(unit)
        rows.append(out)
    return rows


def write_csv(schedule: Schedule, path: str | Path) -> None:
    """``schedule`` in torch's CSV form, written whole or not at all (a part of a list reads
    back as a whole one)."""
    text = io.StringIO(newline="")
    csv.writer(text).writerows(torch_rows(schedule))
    write_whole(path, text.getvalue())


def read_csv(path: str | Path, name: str | None = None) -> Schedule:
    """Load a CSV schedule (compute-only or with comms); the stage-to-rank map and the
    microbatch count are inferred from the actions, and training from whether any backward
    appears. Returns the actions as written; `add_comms` fills in missing communication."""
    return _read(path, name)[0]


def _read(path: str | Path, name: str | None = None) -> tuple[Schedule, list[list[int]]]:
    """`read_csv`'s schedule, and per rank the cell (counted from 0 in its row, empty cells
    included) of each of its actions, for errors that point into the file."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # (a byte-order mark is not an action)
            texts = [
                [(k, c) for k, c in enumerate(row) if c.strip() and c.strip().lstrip("0123456789") not in TORCH_ONLY]
                for row in csv.reader(f)
            ]
    except OSError as e:
        raise ScheduleError(f"cannot read schedule CSV {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ScheduleError(f"schedule CSV {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    while texts and not texts[-1]:  # (blank lines at the end: no ranks)
        texts.pop()
    empty = next((r for r, row in enumerate(texts) if not row), None)
    if empty is not None and any(texts):  # (a file of blank lines holds no actions: said below)
        raise ScheduleError(
            f"schedule CSV {path}: row {empty} holds no action: each row is one rank's actions (rank {empty} here); "
            "remove the blank row"
        )
    rows, overlaps, cells = [], [], []  # actions per rank; compute indices starting an overlapped cell; cells
    for r, row in enumerate(texts):
        actions, starts, at = [], set(), []
        for k, c in row:
            try:
                parts = parse_cell(c)
            except ScheduleError as e:
                raise ScheduleError(f"schedule CSV {path}: rank {r} cell {k}: {e}") from None
            if len(parts) == 2:
                starts.add(sum(a.op.is_compute for a in actions))
            actions += parts
            at += [k] * len(parts)
        rows.append(actions)
        overlaps.append(frozenset(starts))
        cells.append(at)
    if not rows or not any(rows):
        raise ScheduleError(f"schedule CSV {path} holds no actions")
    owner: dict[int, int] = {}
    for r, row in enumerate(rows):
        for a in row:
            if owner.setdefault(a.stage, r) != r:
                raise ScheduleError(f"schedule CSV {path}: stage {a.stage} appears on ranks {owner[a.stage]} and {r}")
    stages = max(owner) + 1
    if len(owner) < stages:
        one = stages - len(owner) == 1
        said = f"stage{'' if one else 's'} {spans_missing(set(owner), stages)} ha{'s' if one else 've'}"
        raise ScheduleError(f"schedule CSV {path}: {said} no actions, where its largest is {stages - 1}")
    m = max(a.mb for row in rows for a in row) + 1
    n = sum(map(len, rows))
    too_large = too_many(stages, m, f"{stages} stages x {m} microbatches")
    if too_large and n >= stages * m:  # (a gap among them is said by check_written)
        raise ScheduleError(f"schedule CSV {path}: {too_large}")
    training = any(a.op.is_backward for row in rows for a in row)
    schedule = Schedule(
        name or path.stem,
        m,
        tuple(owner[s] for s in range(stages)),
        tuple(tuple(r) for r in rows),
        training,
        overlaps=tuple(overlaps) if any(overlaps) else None,
    )
    return schedule, cells


def from_csv(path: str | Path, transport: str = "nccl") -> Schedule:
    """Load, complete (comms placed to run under ``transport``) and validate a schedule
    written as torch-style CSV; one with comms is checked as written."""
    loaded, cells = _read(path)
    check_written(path, loaded, cells)  # as written, before the comms it implies are added
    has_comms = any(a.op.is_comm for row in loaded.actions for a in row)
    if not has_comms:
        return place_comms(loaded, transport)
    try:
        validate(loaded, transport)
    except ScheduleError as e:
        place_comms(loaded.compute_only(), transport)  # the order itself wrong: that error instead
        # (its steps are the file's actions: named by their cells)
        said = re.sub(r"rank (\d+) step (\d+)", lambda g: f"rank {g[1]} cell {cells[int(g[1])][int(g[2])]}", str(e))
        how = "under NCCL, as ppx run checks them on every backend" if transport == "nccl" else f"under {transport}"
        raise ScheduleError(
            f"schedule CSV {path}: {said} (with the sends and receives written in it, {how}: drop its SEND/RECV "
            "cells and ppx places its own, which run)"
        ) from None
    return loaded
