"""A timeline of computes alone (torch's runtime: its sends, receives and waits not timed):
the gaps before computes that take nothing from another rank are the runtime's overhead; a
compute that waited for another rank's tensor gives a hand-off latency; and the prediction from
them gives back the step they came from, where every gap taken for overhead simulated the waits
again."""

from __future__ import annotations

from statistics import median

import pytest

from helpers.spans import span
from ppx import schedules
from ppx.measure.prediction import cost_samples, costs_from, mean_costs, predict
from ppx.measure.spans import Span
from ppx.measure.unseen_comms import comms_unseen
from ppx.schedules import Costs

KNOWN = Costs(fwd=1.0, bwd=2.0, wgrad=1.0, p2p=0.3, overhead=0.1)


def _computes_only(sched, costs: Costs) -> tuple[list[dict], float]:
    """One simulated step as torch's runtime's timeline has it (computes alone: each compute's
    span ends before the overhead after it), and the simulated step."""
    t = schedules.simulate(sched, costs, "nccl")
    ranks = {
        r: [Span("compute", str(e.action), (e.action,), e.start, e.end - costs.overhead) for e in row]
        for r, row in enumerate(t.events)
    }
    return [{"step": 0, "ranks": ranks}], t.makespan


@pytest.mark.parametrize(
    "name, p, v", [("1f1b", 2, 1), ("gpipe", 3, 1), ("interleaved_1f1b", 2, 2), ("zbv", 2, 2), ("zb_h1", 3, 1)]
)
def test_a_simulated_steps_computes_give_back_its_overhead_hand_offs_and_step(name, p, v):
    sched = schedules.build(name, p, 4, v)
    steps, makespan = _computes_only(sched, KNOWN)
    overhead, p2p = comms_unseen(steps, sched)
    assert overhead and overhead == pytest.approx([KNOWN.overhead] * len(overhead))
    # (a receive behind its rank's earlier batch on NCCL's one stream moves later: ZB-H1 at p=3
    # has one such wait, 0.6 s, of its seven)
    assert p2p and median(p2p) == pytest.approx(KNOWN.p2p)
    samples = cost_samples(steps, sched)
    got = predict(sched, costs_from(mean_costs(samples), sched.num_stages), "nccl")["step_time_s"]
    assert got == pytest.approx(makespan, rel=0.025)  # (ZB-H1 p=3: its 0.6 s in the mean, +2.1%)
    # every gap taken for overhead (the waits in it), as before: the waits simulated again on top
    spans = steps[0]["ranks"].values()
    waits = sum(row[-1].end_s - row[0].start_s - sum(sp.end_s - sp.start_s for sp in row) for row in spans)
    whole = {**mean_costs(samples), "overhead_s": waits / sum(len(row) for row in spans), "p2p_s": 0.0}
    assert predict(sched, costs_from(whole, sched.num_stages), "nccl")["step_time_s"] > 1.02 * makespan


def test_a_timeline_with_its_posts_and_waits_or_one_rank_keeps_its_own_measure():
    sched = schedules.build("gpipe", 2, 2)
    steps, _ = _computes_only(sched, KNOWN)
    steps[0]["ranks"][0].insert(1, span("post", "0SEND_F0", ["0SEND_F0"], 1.0, 1.05))
    assert comms_unseen(steps, sched) is None
    one = schedules.build("gpipe", 1, 2)
    c = lambda a, start, end: span("compute", a, [a], start, end)  # noqa: E731
    assert comms_unseen([{"step": 0, "ranks": {0: [c("0F0", 0, 1), c("0F1", 1.1, 2.1)]}}], one) is None
