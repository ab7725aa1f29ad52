"""Compute-only orders as torch.distributed.pipelining's schedule classes build them, from the
installed torch, without a process group: each class computes every rank's order in its
constructor from its stages' shape, which a stand-in object carries."""

from __future__ import annotations

import types

from ppx.schedules.action import Action
from ppx.schedules.schedule import Schedule


def torch_order(class_name: str, p: int, m: int, v: int = 1) -> Schedule:
    """torch's ``class_name`` order for p ranks, m microbatches and v stages per rank (stage s
    on rank s % p), as a compute-only ppx Schedule."""
    import torch.distributed.pipelining.schedules as torch_schedules

    n = p * v
    stages = [
        types.SimpleNamespace(
            num_stages=n,
            group_size=p,
            group_rank=0,
            stage_index=s,
            is_first=s == 0,
            is_last=s == n - 1,
            stage_index_to_group_rank=None,
        )
        for s in range(0, n, p)
    ]
    sched = getattr(torch_schedules, class_name)(stages, m)
    rows = tuple(
        tuple(Action.parse(str(a)) for a in sched.pipeline_order[r] if a is not None and str(a)[-1].isdigit())
        for r in range(p)
    )
    return Schedule(class_name, m, tuple(s % p for s in range(n)), rows)
