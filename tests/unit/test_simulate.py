"""The simulator (ppx.schedules.sim.simulate): fill-drain step times, and hand-derived timelines on
each transport with latency, posting costs and runtime overhead."""

from __future__ import annotations

import pytest

from ppx import schedules
from ppx.schedules import Costs


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_step_time_is_fill_drain_ideal(name):
    p, m, tf, tb = 4, 8, 10.0, 20.0
    t = schedules.simulate(schedules.build(name, p, m), Costs(fwd=tf, bwd=tb))
    assert t.makespan == pytest.approx((m + p - 1) * (tf + tb))


def test_naive_is_stop_and_wait():
    sched = schedules.build("naive", 3, 1)
    t = schedules.simulate(sched, Costs(fwd=1, bwd=1))
    spans = sorted((e.start, str(e.action)) for row in t.events for e in row)
    assert [a for _, a in spans] == ["0F0", "1F0", "2F0", "2B0", "1B0", "0B0"]


def _starts(timeline):
    return {str(e.action): e.start for row in timeline.events for e in row}


def test_gloo_transport_hand_derived():
    # GPipe p=2 m=2, F = B = 1, 0.5 per hand-off. On gloo each message completes on its own,
    # 0.5 after both ends are posted; stage 1 posts 1RECV_F1 when 1F0 ends (2.5) unless the
    # receive is posted one compute early, at the start (then 1F1 starts on arrival, 2.5).
    sched = schedules.build("gpipe", 2, 2)
    costs = Costs(fwd=1, bwd=1, p2p=0.5)
    late = schedules.simulate(sched, costs, "gloo", 0)
    early = schedules.simulate(sched, costs, "gloo", 1)
    assert _starts(late) == {"0F0": 0, "0F1": 1, "1F0": 1.5, "1F1": 3.0, "1B0": 4, "1B1": 5, "0B0": 5.5, "0B1": 7}
    assert _starts(early) == {"0F0": 0, "0F1": 1, "1F0": 1.5, "1F1": 2.5, "1B0": 3.5, "1B1": 4.5, "0B0": 5, "0B1": 6}
    assert (late.makespan, early.makespan) == (8, 7)


def test_posting_costs_time_per_op_and_sends_leave_when_posted():
    # GPipe p=2 m=2 on gloo, lowered lists, F = B = 1, 0.1 per posted op: 0SEND_F0 is out at 1.1,
    # 1RECV_F1 (posted after 1F0 ends at 2.1) at 2.2, 1SEND_B0 at 4.3, 0RECV_B1 (after 0B0) at 5.4
    t = schedules.simulate(schedules.build("gpipe", 2, 2), Costs(fwd=1, bwd=1, send_post=0.1, recv_post=0.1), "gloo", 0)
    want = {"0F0": 0, "0F1": 1.1, "1F0": 1.1, "1F1": 2.2, "1B0": 3.2, "1B1": 4.3, "0B0": 4.3, "0B1": 5.4}
    assert _starts(t) == pytest.approx(want)
    assert t.makespan == pytest.approx(6.4)
    # every receive posted at the rank's first wait: rank 1 posts two (0.2) before 1F0, which still
    # waits for 0SEND_F0; rank 0 posts SEND_F1 first, then both receives
    up = schedules.simulate(
        schedules.build("gpipe", 2, 2), Costs(fwd=1, bwd=1, send_post=0.1, recv_post=0.1), "gloo", -1
    )
    assert _starts(up) == pytest.approx(want)


def test_simulated_bubble_splits_time_as_a_run_measures_it():
    # GPipe p=2 m=1 on gloo, F = B = 1, 0.1 per send post, 0.5 latency. Rank 0: 0F0 [0, 1], posts
    # 0SEND_F0 until 1.1; 1SEND_B0 is posted from 3.6 and arrives at 4.2: 0.6 of its wait is
    # transfer, 0B0 [4.2, 5.2]. Rank 1 waits from 0 for 0SEND_F0 (out at 1.1, arrives 1.6: 0.6
    # transfer), 1F0 [1.6, 2.6], 1B0 [2.6, 3.6], posts until 3.7. Each rank: compute 2, comm 0.7.
    t = schedules.simulate(schedules.build("gpipe", 2, 1), Costs(fwd=1, bwd=1, p2p=0.5, send_post=0.1), "gloo", -1)
    assert t.makespan == pytest.approx(5.2)
    assert t.compute == pytest.approx([2.0, 2.0]) and t.comm == pytest.approx([0.7, 0.7])
    assert t.bubble_fraction() == pytest.approx(2 * 2.5 / (2 * 5.2))
    # the runtime's overhead between actions is idle, as a run's gaps are
    o = schedules.simulate(schedules.build("gpipe", 2, 1), Costs(fwd=1, bwd=1, overhead=0.25))
    assert o.compute == [2.0, 2.0] and o.comm == [0.0, 0.0] and o.idle(0) == pytest.approx(o.makespan - 2.0)


def test_sends_leave_when_the_compute_ends_not_after_the_overhead():
    t = schedules.simulate(schedules.build("gpipe", 2, 2), Costs(fwd=1, bwd=1, overhead=0.25))
    assert _starts(t)["1F0"] == 1.0  # 0F0 ends at 1; its 0.25 of runtime overhead follows the send


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)])
def test_transports_agree_without_latency_and_gloo_is_never_slower(name, v):
    sched = schedules.build(name, 4, 8, virtual_stages=v)
    free = Costs(fwd=1, bwd=2, wgrad=1)
    nccl = schedules.simulate(sched, free).makespan
    assert all(schedules.simulate(sched, free, "gloo", k).makespan == pytest.approx(nccl) for k in (0, 1, 3))
    slow = Costs(fwd=1, bwd=2, wgrad=1, p2p=0.3, overhead=0.1)
    strict = schedules.simulate(sched, slow).makespan
    assert schedules.simulate(sched, slow, "gloo", 0).makespan <= strict + 1e-9
    assert (
        schedules.simulate(sched, slow, "gloo", 1).makespan
        <= schedules.simulate(sched, slow, "gloo", 0).makespan + 1e-9
    )


def test_simulate_prices_a_whole_backward_apart_with_whole_ms(capsys):
    """--whole-ms is what a B costs (default bwd + wgrad): 1F1B's B's take it, and so does ZB-H1's
    first stage, which ppx's runtime runs whole (its I the whole backward, its W nothing), but
    not its last stage's I's and W's; with no hand-off costs 1F1B's step is (m + p - 1)(F + B)."""
    from ppx.cli import main

    flags = ["-p", "2", "-m", "8", "--fwd-ms", "10", "--bwd-ms", "15", "--wgrad-ms", "5"]

    def step(*extra) -> str:
        assert main(["simulate", *flags, *extra]) == 0
        return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("predicted step time"))

    assert "predicted step time 270.00 ms" in step("1f1b")  # 9 x (10 + 20)
    assert "predicted step time 360.00 ms" in step("1f1b", "--whole-ms", "30")  # 9 x (10 + 30)
    assert step("zb_h1") == step("zb_h1", "--whole-ms", "20")  # (whole at I + W: the same step)
    assert step("zb_h1", "--whole-ms", "30") == step("zb_h1", "--bwd-ms", "30,15", "--wgrad-ms", "0,5")
    assert step("zb_h1", "--drain") != step("zb_h1", "--drain", "--whole-ms", "30")
