"""The validator rejects hand-broken action lists with an error naming the rank and step."""

from __future__ import annotations

import pytest

from ppx import schedules
from ppx.errors import ScheduleError
from ppx.schedules import Action, Schedule
from ppx.schedules.comms.lowering import add_comms


def make(rows, m, training=True, s2r=None, comms=True):
    acts = [[Action.parse(a) for a in row.split()] for row in rows]
    sched = Schedule("hand", m, tuple(s2r or range(len(rows))), tuple(map(tuple, acts)), training)
    return add_comms(sched) if comms else sched


def rejects(sched, *fragments):
    with pytest.raises(ScheduleError) as e:
        schedules.validate(sched)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, msg
    return msg


def test_accepts_a_hand_written_gpipe():
    schedules.validate(make(["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"], 2))


def test_backward_before_forward():
    rejects(make(["0F0 0B1 0F1 0B0", "1F0 1F1 1B0 1B1"], 2), "rank 0", "(0B1)", "backward before its forward 0F1")


def test_missing_microbatch():
    rejects(make(["0F0 0B0", "1F0 1F1 1B0 1B1"], 2), "stage 0 never runs forward 0F1")


def test_duplicate_microbatch():
    rejects(make(["0F0 0F0 0B0", "1F0 1B0"], 1), "rank 0", "0F0 appears 2 times")


def test_missing_backward():
    rejects(make(["0F0 0F1 0B0", "1F0 1F1 1B0 1B1"], 2), "never runs the backward of microbatch 1")


def test_action_on_the_wrong_rank():
    rejects(make(["0F0 0B0 1F0", "1B0"], 1, comms=False), "rank 0 step 2 (1F0)", "belongs to rank 1")


def test_receive_without_send():
    sched = make(["0F0 0B0", "1F0 1B0"], 1)
    broken = sched.with_actions([[a for a in sched.actions[0] if str(a) != "0SEND_F0"], sched.actions[1]])
    rejects(broken, "0SEND_F0 is missing")


def test_send_before_the_data_exists():
    rows = make(["0F0 0B0", "1F0 1B0"], 1).actions
    row0 = [Action.parse("0SEND_F0")] + [a for a in rows[0] if str(a) != "0SEND_F0"]
    rejects(
        Schedule("hand", 1, (0, 1), (tuple(row0), rows[1])), "rank 0 step 0 (0SEND_F0)", "before 0F0 has produced it"
    )


def test_sends_and_receives_out_of_order():
    # rank 0 posts its receives of microbatches 0 and 1 in one batch, rank 1 sends 1 then 0 in
    # one: matched by microbatch the batches would run, but NCCL matches in order
    rows = [
        "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0RECV_B1 0B0 0B1",
        "1RECV_F0 1F0 1RECV_F1 1F1 1B1 1B0 1SEND_B1 1SEND_B0",
    ]
    msg = rejects(make(rows, 2, comms=False), "different order")
    assert msg == (
        "rank 1 step 6 (1SEND_B1) is matched by rank 0 step 4 (0RECV_B0): "
        "sends and receives between ranks 1 and 0 are in a different order"
    )
    # on gloo, a swap that runs (each message completes on its own) still swaps the data
    # rank 1 returns gradients 0 then 1, but rank 0 receives 1 first
    with pytest.raises(ScheduleError, match="between ranks 1 and 0 are in a different order"):
        schedules.validate(make(["0F0 0F1 0B1 0B0", "1F0 1F1 1B0 1B1"], 2), "gloo")


def test_a_swap_that_cannot_run_is_reported_as_the_deadlock_it_is():
    # rank 1 runs 1F1 before 1F0, its receives lowered to match: the channel orders differ,
    # but the real error is that the order cannot run: rank 0's batch [0SEND_F0] waits for
    # 1RECV_F0, which rank 1 posts after 1F1, which waits for 0SEND_F1, queued behind it
    msg = rejects(make(["0F0 0F1 0B0 0B1", "1F1 1F0 1B0 1B1"], 2))
    assert msg == (
        "schedule deadlocks: rank 0 step 1 (0SEND_F0), a batch of sends only, waits for 1RECV_F0 on rank 1, "
        "which rank 1 posts only at step 2; "
        "rank 1 step 1 (1F1) waits for 0SEND_F1 on rank 0 (step 3), "
        "which rank 0 starts only after its own batch at step 1 (0SEND_F0) completes"
    )
    # on gloo the swap runs (each message completes on its own), but swaps the data
    with pytest.raises(ScheduleError, match="between ranks 0 and 1 are in a different order"):
        schedules.validate(make(["0F0 0F1 0B0 0B1", "1F1 1F0 1B0 1B1"], 2), "gloo")
    # the same with backwards swapped on rank 0
    rejects(
        make(["0F0 0F1 0B1 0B0", "1F0 1F1 1B0 1B1"], 2),
        "schedule deadlocks: rank 0 step 5 (0B1) waits for 1SEND_B1 on rank 1 (step 7), "
        "which rank 1 starts only after its own batch at step 5 (1SEND_B0) completes; "
        "rank 1 step 5 (1SEND_B0), a batch of sends only, waits for 0RECV_B0 on rank 0, which rank 0 posts only at step 6",
    )


def test_a_send_send_cross_names_the_send_only_batches():
    # each rank posts a batch of sends only before the receive its peer's send needs: on NCCL
    # rank 0's [0SEND_F1] waits for 1RECV_F1, queued behind rank 1's [1SEND_B0], which waits
    # for 0RECV_B0, queued behind [0SEND_F1]. Both sends are posted: the blockers are the batches
    rows = [
        "0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1 0RECV_B2 0I2 0W2",
        "1RECV_F0 1F0 1I0 1SEND_B0 1W0 1RECV_F1 1F1 1I1 1SEND_B1 1W1 1RECV_F2 1F2 1I2 1SEND_B2 1W2",
    ]
    msg = rejects(make(rows, 3, comms=False))
    assert msg == (
        "schedule deadlocks: "
        "rank 0 step 3 (0SEND_F1), a batch of sends only, waits for 1RECV_F1 on rank 1 (step 5), "
        "which rank 1 starts only after its own batch at step 3 (1SEND_B0) completes; "
        "rank 1 step 3 (1SEND_B0), a batch of sends only, waits for 0RECV_B0 on rank 0 (step 6), "
        "which rank 0 starts only after its own batch at step 3 (0SEND_F1) completes"
    )
    # gloo completes every send on its own: the same list runs there
    schedules.validate(make(rows, 3, comms=False), "gloo")


def test_deadlock_is_found_by_the_dry_run():
    # rank 0 waits for the gradient of microbatch 0 before sending microbatch 1, but rank 1
    # runs both forwards before its first backward: neither can move.
    msg = rejects(make(["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"], 2), "deadlocks", "rank 0", "rank 1")
    assert "(0B0) waits for 1SEND_B0 on rank 1" in msg and "(1F1) waits for 0SEND_F1 on rank 0" in msg


def test_forward_only_must_not_backward():
    rejects(make(["0F0 0B0", "1F0 1B0"], 1, training=False, comms=False), "forward-only schedule has no backward")
    rejects(make(["0F0 0B0", "1F0 1B0"], 1, training=False), "(0RECV_B0)", "sends no gradients")


def test_microbatch_out_of_range():
    rejects(make(["0F0 0F5 0B0 0B5", "1F0 1F5 1B0 1B5"], 2), "microbatch 5 out of range")


def test_builtin_lists_validate_for_every_shape():
    for name in schedules.FAMILIES:
        for p in range(1, 5):
            for m in (1, 2, 4, 8):
                v = schedules.default_virtual(name)
                if schedules.family(name).shape_error(p, m, v):  # interleaved's m % p, dualpipev's m >= 2p
                    continue
                schedules.validate(schedules.build(name, p, m, v))
