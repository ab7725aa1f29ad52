"""The simulator's two transports on lists small enough to time by hand."""

from __future__ import annotations

import pytest

from ppx import schedules
from ppx.errors import ScheduleError
from ppx.schedules import Action, Costs, Schedule

COSTS = Costs(fwd=1, bwd=2, p2p=0.5)


def starts(t):
    return [[(str(e.action), e.start) for e in row] for row in t.events]


def test_1f1b_p2_m2_on_nccl():
    # rank 0: 0F0 [0SEND_F0] 0F1 [0SEND_F1 0RECV_B0] 0B0 [0RECV_B1] 0B1
    # rank 1: [1RECV_F0] 1F0 1B0 [1SEND_B0 1RECV_F1] 1F1 1B1 [1SEND_B1]
    # 0F0 [0, 1]; 0SEND_F0 meets the posted 1RECV_F0 at 1, done 1.5: 1F0 [1.5, 2.5], 1B0 [2.5, 4.5].
    # Rank 1's batch [1SEND_B0 1RECV_F1] is active at 4.5, rank 0's [0SEND_F1 0RECV_B0] since 2:
    # both messages done 5.0, so 0B0 [5, 7] and 1F1 [5, 6], 1B1 [6, 8]; 1SEND_B1 meets 0RECV_B1
    # (posted at 7) at 8, done 8.5: 0B1 [8.5, 10.5]. Rank 1 ends when its last send is done, 8.5.
    t = schedules.simulate(schedules.build("1f1b", 2, 2), COSTS)
    assert starts(t) == [
        [("0F0", 0), ("0F1", 1), ("0B0", 5), ("0B1", 8.5)],
        [("1F0", 1.5), ("1B0", 2.5), ("1F1", 5), ("1B1", 6)],
    ]
    assert t.rank_end == [10.5, 8.5] and t.makespan == 10.5
    # rank 0's waits: 0RECV_B0 from 2 to 5 and 0RECV_B1 from 7 to 8.5, transfer the last 0.5 of each
    assert t.compute == [6, 6] and t.comm[0] == pytest.approx(1.0)
    # nccl batches are the lowered list's: receiving early does not apply
    assert starts(schedules.simulate(schedules.build("1f1b", 2, 2), COSTS, "nccl", 1)) == starts(t)


def test_1f1b_p2_m2_on_gloo():
    # Receives posted where lowered: every message waits for its later end, as on nccl: 10.5.
    sched = schedules.build("1f1b", 2, 2)
    assert schedules.simulate(sched, COSTS, "gloo", 0).makespan == 10.5
    # One compute early: rank 0 posts 0RECV_B0 at 1 and 0RECV_B1 at 2, rank 1 posts 1RECV_F1 at 2.5
    # (before 1B0), so 1RECV_F1 is done at 3 and 1F1 runs as soon as 1B0 ends: 1F0 [1.5, 2.5],
    # 1B0 [2.5, 4.5], 1F1 [4.5, 5.5], 1B1 [5.5, 7.5]. 0RECV_B0 is done 4.5 + 0.5 = 5: 0B0 [5, 7];
    # 0RECV_B1 at 7.5 + 0.5 = 8: 0B1 [8, 10].
    t = schedules.simulate(sched, COSTS, "gloo", 1)
    assert starts(t) == [
        [("0F0", 0), ("0F1", 1), ("0B0", 5), ("0B1", 8)],
        [("1F0", 1.5), ("1B0", 2.5), ("1F1", 4.5), ("1B1", 5.5)],
    ]
    assert t.rank_end == [10, 8] and t.makespan == 10


def test_crossed_sends_deadlock_on_nccl_only():
    # Rank 0 sends microbatch 0 then 1, rank 1 receives 1 then 0, each in its own batch. On nccl
    # the head batches [0SEND_F0] and [1RECV_F1] wait for each other's next batch; on gloo every
    # message completes on its own (the validator rejects the list: NCCL matches in order).
    rows = ["0F0 0SEND_F0 0F1 0SEND_F1", "1RECV_F1 1F1 1RECV_F0 1F0"]
    acts = tuple(tuple(Action.parse(a) for a in row.split()) for row in rows)
    sched = Schedule("crossed", 2, (0, 1), acts, training=False)
    with pytest.raises(ScheduleError) as e:
        schedules.simulate(sched, COSTS)
    assert str(e.value) == (
        "schedule deadlocks: rank 0 step 1 (0SEND_F0), a batch of sends only, waits for 1RECV_F0 on rank 1, "
        "which rank 1 posts only at step 2; rank 1 step 1 (1F1) waits for 0SEND_F1 on rank 0 (step 3), "
        "which rank 0 starts only after its own batch at step 1 (0SEND_F0) completes"
    )
    # gloo: 0SEND_F1 out at 2, done 2.5: 1F1 [2.5, 3.5]; 1RECV_F0 is posted when 1F1 ends, so
    # 0SEND_F0 (out since 1) is done at 3.5 + 0.5 = 4: 1F0 [4, 5], and rank 0 drains at 4.
    t = schedules.simulate(sched, COSTS, "gloo")
    assert starts(t) == [[("0F0", 0), ("0F1", 1)], [("1F1", 2.5), ("1F0", 4)]]
    assert t.rank_end == [4, 5]


def test_unknown_transport():
    with pytest.raises(ScheduleError, match="unknown transport 'mpi'; choose nccl or gloo"):
        schedules.simulate(schedules.build("1f1b", 2, 2), COSTS, "mpi")
