"""Step-time predictions from measured cost samples (ppx.measure.prediction)."""

from __future__ import annotations

import pytest

from helpers.spans import span
from ppx import schedules
from ppx.measure.prediction import cost_samples, costs_from, mean_costs, predict, predict_expected
from ppx.schedules import Costs


def test_sampled_costs_match_constants_and_cost_more_when_they_vary():
    sched = schedules.build("1f1b", 4, 8)
    flat = {f"{s}{op}": [v] for s in range(4) for op, v in (("F", 1.0), ("B", 2.0))}
    for transport, k in (("nccl", 0), ("gloo", 1)):
        sampled = schedules.simulate(sched, schedules.SampledCosts(flat, [0.1], [0.05]), transport, k).makespan
        fixed = schedules.simulate(sched, Costs(fwd=1, bwd=2, p2p=0.1, overhead=0.05), transport, k).makespan
        assert sampled == pytest.approx(fixed)
    # the same means, spread out: a slow action on the critical path costs all of its delay
    spread = {f"{s}{op}": vs for s in range(4) for op, vs in (("F", [0.5, 1.5]), ("B", [1.0, 3.0]))}
    samples = {"action_s": spread, "p2p_s": [0.0, 0.2], "overhead_s": [0.05]}
    expected = predict_expected(sched, samples, "gloo", 1, draws=64, seed=1)["step_time_s"]
    of_means = predict(sched, Costs(fwd=1, bwd=2, p2p=0.1, overhead=0.05), "gloo", 1)["step_time_s"]
    assert expected > of_means * 1.03
    assert predict_expected(sched, samples, "gloo", 1, draws=8, seed=1) == predict_expected(
        sched, samples, "gloo", 1, draws=8, seed=1
    )


def test_cost_samples_split_posting_into_sends_and_receives():
    # rank 0: one send alone (0.1 s), then a send and a receive together (0.13 s: the receive gets
    # 0.13 - 0.1); rank 1 posts two receives at once (0.02 each) and waits for 0F0's send
    r0 = [
        span("compute", "0F0", ["0F0"], 0.0, 1.0),
        span("post", "0SEND_F0", ["0SEND_F0"], 1.0, 1.1),
        span("compute", "0F1", ["0F1"], 1.15, 2.15),
        span("post", "0SEND_F1 0RECV_B0", ["0SEND_F1", "0RECV_B0"], 2.15, 2.28),
    ]
    r1 = [
        span("post", "1RECV_F0 1RECV_F1", ["1RECV_F0", "1RECV_F1"], 0.0, 0.04),
        span("wait", "wait 1RECV_F0", ["1RECV_F0"], 0.04, 1.3),
        span("compute", "1F0", ["1F0"], 1.3, 2.3),
        span("wait", "wait 1RECV_F1", ["1RECV_F1"], 2.3, 2.5),
        span("compute", "1F1", ["1F1"], 2.5, 3.5),
    ]
    sched = schedules.build("gpipe", 2, 2)
    samples = cost_samples([{"step": 0, "ranks": {0: r0, 1: r1}}], sched)
    assert samples["send_post_s"] == pytest.approx([0.1])
    assert samples["recv_post_s"] == pytest.approx([0.02, 0.03])
    assert samples["p2p_s"] == pytest.approx([0.2])  # 0SEND_F0 out at 1.1, waited for until 1.3; 1F1's wait began later
    assert samples["overhead_s"] == pytest.approx([0.025, 0.0])  # rank 0's 0.05 gap over its two computes
    costs = costs_from(mean_costs(samples), 2)
    assert (costs.send_post, costs.recv_post) == pytest.approx((0.1, 0.025))


def test_a_stage_that_ran_bs_and_is_and_ws_keeps_its_b_apart():
    """A drain run's split stage measured whole B's beside its I's and W's: the simulator
    costs its B's as measured, not as I + W (the split's own cost, which the B never paid)."""
    measured = {"action_s": {"0F": 1.0, "0B": 2.0, "1F": 1.0, "1B": 2.5, "1I": 2.0, "1W": 1.0}, "p2p_s": 0.0}
    c = costs_from(measured, 2)
    assert c.whole == [None, 2.5] and c.bwd == [2.0, 2.0] and c.wgrad == [0.0, 1.0]
    from ppx.schedules.ir.action import Action, Op

    assert c.work(Action(1, Op.B, 0)) == 2.5 and c.work(Action(0, Op.B, 0)) == 2.0 and c.work(Action(1, Op.I, 0)) == 2.0
    assert costs_from({"action_s": {"0F": 1.0, "0B": 2.0}, "p2p_s": 0.0}, 1).whole is None


def test_microbatch_0s_samples_are_drawn_for_microbatch_0_and_only_there():
    """A step's first action of each kind on a stage costs more (its forward +11-37% on
    llama-tiny and the transformer on CPU) and sits on the pipeline's fill: drawn among the
    others it spread over actions whose delay the schedule absorbs, and the expected step came
    out 2-5% short. cost_samples keeps microbatch 0's apart (first_s) and the draws give them
    to microbatch 0 alone."""
    r0 = [span("compute", "0F0", ["0F0"], 0.0, 3.0), span("compute", "0F1", ["0F1"], 3.0, 4.0)]
    samples = cost_samples([{"step": 0, "ranks": {0: r0}}], schedules.build("gpipe", 2, 2))
    assert samples["action_s"]["0F"] == pytest.approx([3.0, 1.0])
    assert samples["first_s"] == {"0F": pytest.approx([3.0])}


def test_first_samples_come_out_of_the_others_and_only_those_the_list_still_holds():
    from ppx.schedules.ir.action import Action, Op
    from ppx.schedules.sim.costs import split_first

    actions = {"0F": [3.0, 1.0, 1.0, 2.9, 1.0], "0B": [2.0, 2.0], "1F": [5.0, 1.0]}
    # 0F: two steps' firsts taken out; 0B: its one first left out of the list as a stall: no
    # first; 1F: one of its two firsts left out as a stall, the other kept
    first, later = split_first(actions, {"0F": [3.0, 2.9], "0B": [7.0], "1F": [5.0, 9.0]})
    assert first == {"0F": [3.0, 2.9], "1F": [5.0]}
    assert later == {"0F": [1.0, 1.0, 1.0], "0B": [2.0, 2.0], "1F": [1.0]}
    assert split_first(actions, None) == ({}, actions)
    costs = schedules.SampledCosts(later, [0.0], [0.0], 0, first=first)
    assert {costs.work(Action(0, Op.F, 0)) for _ in range(20)} == {3.0, 2.9}
    assert {costs.work(Action(0, Op.F, 1)) for _ in range(20)} == {1.0}
    assert costs.work(Action(0, Op.B, 0)) == 2.0


def test_a_slow_first_forward_on_the_fill_costs_its_whole_delay():
    """Stage 0's first forward 3 s against 1 s for the others: the expected step with it apart
    is the step of those costs exactly (every draw the same), where pooled draws charge each
    forward the mean and come out short."""
    sched = schedules.build("1f1b", 2, 4)
    actions = {"0F": [3.0, 1.0, 1.0, 1.0], "1F": [1.0] * 4, "0B": [2.0] * 4, "1B": [2.0] * 4}
    base = {"action_s": actions, "p2p_s": [0.0], "overhead_s": [0.0]}
    apart = predict_expected(sched, {**base, "first_s": {"0F": [3.0]}}, "nccl")["step_time_s"]
    pooled = predict_expected(sched, base, "nccl")["step_time_s"]
    slow_first = schedules.simulate(sched, Costs(fwd=1, bwd=2), "nccl").makespan + 2.0  # its delay, on the fill
    assert apart == pytest.approx(slow_first)
    assert pooled < 0.98 * apart  # (16.6 against 17.0)
