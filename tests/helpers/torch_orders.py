"""Compute-only orders as torch.distributed.pipelining's schedule classes build them, from the
installed torch, without a process group: each class computes every rank's order in its
constructor from its stages' shape, which a stand-in object carries."""

from __future__ import annotations

import types

from ppx.schedules.ir.action import parse_cell
from ppx.schedules.ir.schedule import Schedule

V_SHAPED = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")  # stage s on rank s, then back: 2p-1-s
TORCH_ONLY = ("REDUCE_GRAD", "UNSHARD", "RESHARD")


def _torch_schedule(class_name: str, p: int, m: int, v: int, **kwargs):
    """torch's schedule object for rank 0 of p (every rank's order is in it), and the
    stage-to-rank map."""
    import torch
    import torch.distributed.pipelining.schedules as torch_schedules

    n = p * v
    v_shape = class_name in V_SHAPED
    s2r = tuple(s if s < p else 2 * p - 1 - s for s in range(n)) if v_shape else tuple(s % p for s in range(n))
    stages = [
        types.SimpleNamespace(
            num_stages=n,
            group_size=p,
            group_rank=0,
            stage_index=s,
            is_first=s == 0,
            is_last=s == n - 1,
            stage_index_to_group_rank=None,
            submod=torch.nn.Module(),
        )
        for s in range(n)
        if s2r[s] == 0
    ]
    cls = getattr(torch_schedules, class_name)
    single = issubclass(cls, torch_schedules.PipelineScheduleSingle)  # GPipe, 1F1B: one stage per rank
    return cls(stages[0] if single else stages, m, **kwargs), s2r


def torch_csv_with_comms(class_name: str, p: int, m: int, v: int, path, defer_pp_recv: bool = False) -> None:
    """torch's order *with its own sends and receives* (its lowering, ``defer_pp_recv`` as
    asked) written as torch's CSV."""
    import csv

    sched, _ = _torch_schedule(class_name, p, m, v, defer_pp_recv=defer_pp_recv)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([str(a) for a in sched.pipeline_order_with_comms[r]] for r in range(p))


def torch_order(class_name: str, p: int, m: int, v: int = 1) -> Schedule:
    """torch's ``class_name`` order for p ranks, m microbatches and v stages per rank (stage s
    on rank s % p, or in V placement for ZB-V and DualPipeV, v = 2), as a compute-only ppx
    Schedule, overlapped cells (OVERLAP_F_B) included."""
    sched, s2r = _torch_schedule(class_name, p, m, v)
    rows, overlaps = [], []
    for r in range(p):
        row, cells = [], set()
        for a in sched.pipeline_order[r]:
            if a is None or str(a).endswith(TORCH_ONLY):
                continue
            parts = parse_cell(str(a))
            if len(parts) == 2:
                cells.add(len(row))
            row += parts
        rows.append(tuple(row))
        overlaps.append(frozenset(cells))
    return Schedule(class_name, m, s2r, tuple(rows), overlaps=tuple(overlaps) if any(overlaps) else None)
