"""A --from-run plan's drawn costs (`ppx.plan.sampled`): with one sample per action they give
exactly the means' prediction, whatever the candidate's stages against the run's (summed
groups, cut parts, B from I + W); with spread samples the expected step exceeds the step of
the mean costs (the critical path pays every slow draw)."""

from __future__ import annotations

import pytest

from ppx.plan.inputs import PlanInputs
from ppx.plan.sampled import PlanSamples, expected
from ppx.schedules import registry
from ppx.schedules.sim.simulate import simulate

F, IG, W = [0.010, 0.012, 0.011, 0.015], [0.009, 0.010, 0.013, 0.016], [0.004, 0.005, 0.006, 0.007]


def samples(spread: float = 0.0) -> dict:
    actions = {}
    for s in range(4):
        for op, values in (("F", F), ("I", IG), ("W", W)):
            actions[f"{s}{op}"] = [values[s] * (1 - spread), values[s] * (1 + spread)] if spread else [values[s]]
    return {
        "action_s": actions,
        "p2p_s": [0.0005],
        "overhead_s": [0.0001],
        "send_post_s": [2e-5],
        "recv_post_s": [1e-5],
    }


def inputs() -> PlanInputs:
    return PlanInputs(
        fwd_s=tuple(F),
        bwd_s=tuple(IG),
        wgrad_s=tuple(W),
        stages=4,
        p2p_s=0.0005,
        overhead_s=0.0001,
        send_post_s=2e-5,
        recv_post_s=1e-5,
        transport="gloo",
        lookahead=-1,
    )


@pytest.mark.parametrize(
    "name,p,v",
    [("1f1b", 4, 1), ("zb_h1", 4, 1), ("interleaved_zb", 4, 2), ("zbv", 4, 2), ("1f1b", 2, 1), ("gpipe", 2, 1)],
)
def test_one_sample_each_is_the_means_prediction(name, p, v):
    # p=2 sums pairs of the run's 4 stages; v=2 cuts each in half; 1f1b's B is drawn as I + W
    sched = registry.build(name, p, 8, v, "gloo")
    n = sched.num_stages
    means = simulate(sched, inputs().costs(n), "gloo", -1)
    drawn = simulate(sched, PlanSamples(samples(), inputs().parts(n)), "gloo", -1)
    assert drawn.makespan == pytest.approx(means.makespan, rel=1e-12)
    assert drawn.bubble_fraction() == pytest.approx(means.bubble_fraction(), rel=1e-9)


def test_one_sample_each_is_the_means_prediction_when_units_regroup():
    # the run's 4 stages of 2, 1, 2, 1 model units, weighed unequally, regrouped into 2 x 3 stages
    from dataclasses import replace

    from ppx.plan.unit_weights import UnitWeights

    w = UnitWeights(flops=(1, 3, 2, 2, 5, 1), saved_bytes=(1,) * 6, param_bytes=(1,) * 6)
    regrouped = replace(inputs(), run_units=(2, 1, 2, 1), unit_weights=w)
    sched = registry.build("interleaved_1f1b", 2, 8, 3, "gloo")
    assert regrouped.parts(6) != inputs().parts(6)
    means = simulate(sched, regrouped.costs(6), "gloo", -1)
    drawn = simulate(sched, PlanSamples(samples(), regrouped.parts(6)), "gloo", -1)
    assert drawn.makespan == pytest.approx(means.makespan, rel=1e-12)
    # with a data-parallel reduction, shared out by parameter bytes on both paths
    w = UnitWeights(flops=(1, 3, 2, 2, 5, 1), saved_bytes=(1,) * 6, param_bytes=(4, 1, 1, 2, 1, 3))
    reducing = replace(regrouped, unit_weights=w, reduce_s=(0.002, 0.001, 0.003, 0.001))
    drawn_samples = {
        **samples(),
        "action_s": {**samples()["action_s"], **{f"{s}REDUCE_GRAD": [r] for s, r in enumerate(reducing.reduce_s)}},
    }
    means = simulate(sched, reducing.costs(6), "gloo", -1, True)
    drawn = simulate(
        sched, PlanSamples(drawn_samples, reducing.parts(6), 0, reducing.parts(6, "params")), "gloo", -1, True
    )
    assert means.makespan != pytest.approx(simulate(sched, regrouped.costs(6), "gloo", -1).makespan, rel=1e-6)
    assert drawn.makespan == pytest.approx(means.makespan, rel=1e-12)


def test_spread_samples_predict_a_longer_step_than_their_means():
    sched = registry.build("1f1b", 4, 8, 1, "gloo")
    means = simulate(sched, inputs().costs(4), "gloo", -1).makespan
    step, bubble, steady = expected(lambda c: simulate(sched, c, "gloo", -1), samples(spread=0.3), inputs().parts(4))
    assert steady <= step
    assert step > means * 1.01, (step, means)
    assert 0 < bubble < 1


def test_a_candidates_microbatch_0_draws_the_runs_first_samples_of_each_part():
    """A run's microbatch 0 samples (``first_s``: a step's first action of its kind, which
    costs more) price a candidate's microbatch 0, each of its stage's parts from its own run
    stage, and its B from the first I and W: the run's own prediction draws them alike."""
    from ppx.schedules.ir.action import Action, Op
    from ppx.schedules.sim.costs import split_first

    base = samples()
    firsts = {k: [v[0] * 3] for k, v in base["action_s"].items()}
    with_first = {**base, "action_s": {k: [*firsts[k], *v] for k, v in base["action_s"].items()}, "first_s": firsts}
    first, later = split_first(with_first["action_s"], firsts)
    drawn = PlanSamples({**with_first, "action_s": later}, inputs().parts(2), first=first)
    assert drawn.work(Action(0, Op.F, 0)) == pytest.approx(3 * (F[0] + F[1]))  # (the run's stages 0 and 1)
    assert drawn.work(Action(0, Op.F, 1)) == pytest.approx(F[0] + F[1])
    assert drawn.work(Action(1, Op.B, 0)) == pytest.approx(3 * (IG[2] + W[2] + IG[3] + W[3]))
    # only the run's stage 0 forward slow on microbatch 0: the candidate's first forward, on
    # the fill, costs its whole delay in the expected step
    one = {**base, "action_s": {**base["action_s"], "0F": [3 * F[0], F[0]]}, "first_s": {"0F": [3 * F[0]]}}
    sched = registry.build("1f1b", 2, 8, 1, "gloo")
    plain = expected(lambda c: simulate(sched, c, "gloo", -1), base, inputs().parts(2))[0]
    slow = expected(lambda c: simulate(sched, c, "gloo", -1), one, inputs().parts(2))[0]
    assert slow == pytest.approx(plain + 2 * F[0], rel=1e-9)
