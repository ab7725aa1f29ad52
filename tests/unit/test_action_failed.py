"""A failed item's report (`ppx.engine.runtime.ActionFailed`): which process a failed wait was
waiting for, as the job numbers its processes (labels name pipeline ranks, as the schedule)."""

from __future__ import annotations

import torch

from ppx.engine.runtime import ActionFailed, Runtime
from ppx.models.action_clock import ActionClock
from ppx.schedules import build


def _runtime(rank: int, global_ranks=None) -> Runtime:
    schedule = build("1f1b", 2, 4)
    return Runtime(
        schedule, rank, {}, None, torch.device("cpu"), lambda s: None, clock=ActionClock(), global_ranks=global_ranks
    )


def test_a_wait_names_the_process_it_waits_for_and_other_items_none():
    rt = _runtime(0, global_ranks=[1, 3])  # replica 1 of pp=2 x dp=2: pipeline ranks 0, 1 are processes 1, 3
    waits = [it for it in rt.program if it.kind == "wait"]
    assert waits and all(it.label.endswith("from rank 1") for it in waits)  # the pipeline rank, as the grid
    assert {rt._waited_on(it) for it in waits} == {3}
    assert rt._waited_on(next(it for it in rt.program if it.kind == "compute")) is None
    assert rt._waited_on(None) is None
    assert {_runtime(1)._waited_on(it) for it in _runtime(1).program if it.kind == "wait"} == {0}


def test_action_failed_carries_the_peer():
    e = ActionFailed(3, 2, "wait 1RECV_F0 from rank 0", RuntimeError("closed"), peer=1)
    assert (str(e), e.peer) == ("rank 3 failed at step 2 on wait 1RECV_F0 from rank 0: RuntimeError: closed", 1)
    assert ActionFailed(0, 0, "0F0", ValueError()).peer is None
