"""A timeline of computes alone (torch's runtime: its sends, receives and waits not timed):
the gaps before computes that take nothing from another rank are the runtime's overhead; a
compute that waited for another rank's tensor gives a hand-off latency, its overhead taken off;
and the prediction from them no longer simulates the waits twice."""

from __future__ import annotations

import pytest

from helpers.spans import span
from ppx import schedules
from ppx.measure.prediction import cost_samples, costs_from, mean_costs, predict
from ppx.measure.unseen_comms import comms_unseen


def _gpipe_step():
    """GPipe p=2 m=2: F 1 s, B 2 s, overhead 0.1 s after every compute, hand-offs 0.3 s."""
    c = lambda a, start, end: span("compute", a, [a], start, end)  # noqa: E731
    r0 = [c("0F0", 0.0, 1.0), c("0F1", 1.1, 2.1), c("0B0", 6.0, 8.0), c("0B1", 8.1, 10.1)]
    # rank 1: 1F0 waits for 0F0 (ends 1.0) + 0.3 + 0.1; 1F1 for 0F1 (2.1): its own 1F0 ends 2.4, later
    r1 = [c("1F0", 1.4, 2.4), c("1F1", 2.5, 3.5), c("1B0", 3.6, 5.6), c("1B1", 5.7, 7.7)]
    return [{"step": 0, "ranks": {0: r0, 1: r1}}]


def test_gaps_before_computes_that_take_nothing_are_overhead_and_waits_give_latencies():
    sched = schedules.build("gpipe", 2, 2)
    overhead, p2p = comms_unseen(_gpipe_step(), sched)
    # rank 0: 0F1 (its data is its own); rank 1: 1B0, 1B1 (the last stage's own loss)
    assert overhead == pytest.approx([0.1, 0.1, 0.1])
    # 1F0: no compute before it on its rank; 1F1: rank 1 busy until 2.4, after 0F1's end (2.1): no
    # wait; 0B0: rank 0 idle since 2.1, 1B0 ends 5.6, 0B0 starts 6.0 = 0.3 + 0.1 of overhead after
    # it; 0B1: 1B1 ends 7.7 while rank 0 is busy until 8.0: no wait
    assert p2p == pytest.approx([0.3])
    samples = cost_samples(_gpipe_step(), sched)
    assert samples["overhead_s"] == pytest.approx([0.1, 0.1, 0.1]) and samples["p2p_s"] == pytest.approx([0.3])
    # simulated at those costs the step is about the measured one, 10.1 s (rank 0's 4.1 s of
    # waits counted as overhead, 1.03 s after each of its computes, were simulated again on top)
    predicted = predict(sched, costs_from(mean_costs(samples), 2), "nccl")["step_time_s"]
    assert predicted == pytest.approx(10.1, rel=0.05)
    whole_gaps = {**mean_costs(samples), "overhead_s": (4.1 / 4 + 0.3 / 4) / 2, "p2p_s": 0.0}
    assert predict(sched, costs_from(whole_gaps, 2), "nccl")["step_time_s"] > 1.1 * 10.1


def test_a_timeline_with_its_posts_and_waits_or_one_rank_keeps_its_own_measure():
    sched = schedules.build("gpipe", 2, 2)
    step = _gpipe_step()
    step[0]["ranks"][0].insert(1, span("post", "0SEND_F0", ["0SEND_F0"], 1.0, 1.05))
    assert comms_unseen(step, sched) is None
    one = schedules.build("gpipe", 1, 2)
    c = lambda a, start, end: span("compute", a, [a], start, end)  # noqa: E731
    assert comms_unseen([{"step": 0, "ranks": {0: [c("0F0", 0, 1), c("0F1", 1.1, 2.1)]}}], one) is None
