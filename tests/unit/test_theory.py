"""What a run is held against: the closed form for models of unknown cost, and on the
known-cost model the exact zero-communication value at its configured costs."""

import pytest

from ppx import config, schedules
from ppx.measure.theory import run_theory
from ppx.report.breakdown import rank_theories


def theory(*overrides, backend="gloo"):
    cfg = config.load(None, ["pipeline.stages=2", "pipeline.microbatches=4", *overrides])
    return run_theory(cfg, config.resolve_schedule(cfg), backend)


def test_closed_form_for_a_model_of_unknown_cost():
    t = theory("model.kind=mlp", "pipeline.schedule=1f1b")
    assert t.bubble_fraction == pytest.approx(1 / 5) and t.ideal_step_time_s is None
    assert "closed form (p-1)/(m+p-1)" in t.basis and "same" in t.basis


def test_known_cost_theory_is_the_closed_form_when_stages_are_equal():
    t = theory("model.kind=synthetic", "model.fwd_ms=5", "model.bwd_ms=10", "pipeline.schedule=1f1b")
    assert t.bubble_fraction == pytest.approx(1 / 5) and t.ideal_step_time_s == pytest.approx(5 * 0.015)
    t = theory(
        "model.kind=synthetic", "model.fwd_ms=5", "model.bwd_ms=5", "model.wgrad_ms=5", "pipeline.schedule=zb_h1"
    )
    assert t.bubble_fraction == pytest.approx(1 / 13)  # (p-1)/(3m+p-1)
    assert "exact" in t.basis


def test_known_cost_theory_follows_unequal_costs():
    # stage 1 twice as slow: it sets the pace, the closed form's 20% does not hold
    t = theory("model.kind=synthetic", "model.fwd_ms=[5,10]", "model.bwd_ms=[10,20]", "pipeline.schedule=1f1b")
    # stage 0's first forward, then stage 1 busy for 4 x 30 ms, then stage 0's last backward
    assert t.ideal_step_time_s == pytest.approx(0.005 + 4 * 0.030 + 0.010)
    assert t.bubble_fraction == pytest.approx(1 - (4 * 0.015 + 4 * 0.030) / 2 / 0.135)
    assert t.bubble_fraction != pytest.approx(schedules.theory_bubble("1f1b", 2, 4))
    # each rank idles its own share: stage 0 busy 60 of 135 ms, stage 1 120 (breakdown.png marks each)
    assert t.idle_fraction_by_rank == pytest.approx((75 / 135, 15 / 135))
    assert sum(t.idle_fraction_by_rank) / 2 == pytest.approx(t.bubble_fraction)
    summary = {"bubble_fraction_theory": t.bubble_fraction, "ranks": [{"rank": 1}, {"rank": 0}]}
    assert rank_theories({**summary, "idle_fraction_theory_by_rank": list(t.idle_fraction_by_rank)}) == [
        pytest.approx(15 / 135),
        pytest.approx(75 / 135),
    ]
    assert rank_theories(summary) == [t.bubble_fraction] * 2  # (no rank's own: the bubble's, every rank's)
    assert theory("model.kind=mlp", "pipeline.schedule=1f1b").idle_fraction_by_rank is None
    # ZB-H1 without a weight-gradient cost has no W to fill the bubble with
    zb = theory(
        "model.kind=synthetic", "model.fwd_ms=5", "model.bwd_ms=10", "model.wgrad_ms=0", "pipeline.schedule=zb_h1"
    )
    assert zb.bubble_fraction == pytest.approx(1 / 5)


def test_the_ideal_follows_the_runs_transport():
    # interleaved, unequal stages: NCCL's in-order batches make the zero-communication step longer than gloo's
    args = [
        "model.kind=synthetic",
        "pipeline.stages=4",
        "pipeline.schedule=interleaved_1f1b",
        "model.layers=8",
        "model.fwd_ms=[5,5,20,5,5,20,5,5]",
        "model.bwd_ms=[10,10,40,10,10,40,10,10]",
    ]
    gloo, nccl = theory(*args, backend="gloo"), theory(*args, backend="nccl")
    assert gloo.ideal_step_time_s < nccl.ideal_step_time_s


def test_the_ideal_uses_the_stage_costs_the_modules_charge():
    # per layer, interleaved, an uneven split: the theory's stages cost what the built modules do
    from ppx.engine.rank import build_stage_modules
    from ppx.measure.theory import known_cost_timeline

    cfg = config.load(
        None,
        [
            "model.kind=synthetic",
            "model.cost_per=layer",
            "model.layers=6",
            "model.fwd_ms=[1,2,3,4,5,6]",
            "model.bwd_ms=2",
            "pipeline.stages=2",
            "pipeline.microbatches=4",
            "pipeline.schedule=interleaved_1f1b",
            "pipeline.layers_per_stage=[3,1,1,1]",
        ],
    )
    sched = config.resolve_schedule(cfg)
    modules = build_stage_modules(cfg, sched.num_stages, range(sched.num_stages), "cpu")
    t = known_cost_timeline(cfg, sched, ("gloo", -1))
    for rank, events in enumerate(t.events):
        for e in events:
            mod = modules[e.action.stage]
            want = mod.fwd_ms if e.action.op.value == "F" else mod.bwd_ms + mod.wgrad_ms
            assert e.end - e.start == pytest.approx(want / 1e3), (rank, str(e.action))


def test_per_layer_costs_give_every_placement_the_same_work():
    # 1F1B on 2 ranks (2 layers a stage) and interleaved v=2 (1 layer a stage): the same busy
    # time per rank, m x layers/p x (t_f + t_b); only the bubble differs
    common = ["model.kind=synthetic", "model.cost_per=layer", "model.layers=4", "model.fwd_ms=5", "model.bwd_ms=10"]
    a = theory(*common, "pipeline.schedule=1f1b")
    b = theory(*common, "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2")
    busy = 4 * 2 * 0.015
    assert a.ideal_step_time_s * (1 - a.bubble_fraction) == pytest.approx(busy)
    assert b.ideal_step_time_s * (1 - b.bubble_fraction) == pytest.approx(busy)
    assert a.ideal_step_time_s == pytest.approx(busy * 5 / 4)  # (m+p-1)/m
    assert b.ideal_step_time_s == pytest.approx(busy * 9 / 8)  # (vm+p-1)/(vm)
    # per stage instead (the default), interleaved does v times 1F1B's work
    per_stage = [common[0], *common[2:]]
    c = theory(*per_stage, "pipeline.schedule=1f1b")
    d = theory(*per_stage, "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2")
    assert d.ideal_step_time_s * (1 - d.bubble_fraction) == pytest.approx(
        2 * c.ideal_step_time_s * (1 - c.bubble_fraction)
    )


def test_a_drain_list_has_no_closed_form_unless_drain_changed_nothing():
    """train.split_backward=drain gives B's where the family's formula splits every backward:
    no theory then; at m = p every W follows the last F, the list is the family's, and so is
    its theory."""
    drain = ["model.kind=mlp", "pipeline.schedule=zb_h1", "train.split_backward=drain", "train.batch_size=8"]
    assert theory(*drain, "pipeline.microbatches=8").bubble_fraction is None
    assert theory(*drain, "pipeline.microbatches=2").bubble_fraction == pytest.approx(1 / 7)  # (p-1)/(3m+p-1)


def test_dualpipev_under_drain_keeps_its_closed_form():
    """DualPipeV's own list has B's beside its I's (in its overlapped cells), which drain leaves
    as they are: the list runs as built, and its theory is the family's (a B beside I's is no
    sign that drain changed anything)."""
    from ppx import config
    from ppx.config.resolve import drain_changed

    keys = ["model.kind=mlp", "pipeline.schedule=dualpipev", "pipeline.microbatches=8", "train.batch_size=8"]
    assert not drain_changed(config.load("1f1b_2cpu", [*keys, "train.split_backward=drain"]))
    auto = theory(*keys).bubble_fraction
    assert auto is not None and theory(*keys, "train.split_backward=drain").bubble_fraction == auto


def test_schedule_and_simulate_keep_the_theory_where_drain_changes_nothing(capsys):
    """`--drain` on a list drain leaves as built (DualPipeV's cells; ZB-H1 at m = p) says so and
    keeps the family's formula; where it changes the list, no formula."""
    from ppx.cli import main

    assert main(["schedule", "dualpipev", "-p", "2", "-m", "8", "--drain"]) == 0
    out = capsys.readouterr().out
    assert "(drain leaves this list as built: each W follows its stage's last forward or sits on a rank" in out
    assert ", theory (p-1)/(3m+p-1)" in out
    assert main(["simulate", "zb_h1", "-p", "4", "-m", "4", "--drain"]) == 0
    out = capsys.readouterr().out
    assert "theory (" in out and "note: drain leaves this list as built: every W follows" in out
    assert main(["simulate", "zb_h1", "-p", "4", "-m", "8", "--drain"]) == 0
    assert "theory" not in capsys.readouterr().out


def test_simulate_and_schedule_give_the_theory_of_the_costs_they_are_given(capsys):
    """From cost flags the theory is the list at those costs with zero communication, as `ppx
    run` gives a known-cost run's: unequal stages (or a W the formula does not assume) are not
    the closed form's, which is named beside it; at the formula's own costs, the formula."""
    from ppx.cli import main

    assert main(["simulate", "1f1b", "-p", "3", "-m", "5", "--fwd-ms", "10,10,15", "--bwd-ms", "20,20,30"]) == 0
    out = capsys.readouterr().out
    # the last stage sets the pace: (m + p - 1) F + B of it less what the others' wait overlaps
    assert "predicted step time 285.00 ms, bubble 38.6%" in out, out
    assert (
        "theory (this list at these costs, zero communication): 38.6% (the closed form (p-1)/(m+p-1) says 28.6%" in out
    )
    assert main(["simulate", "1f1b", "-p", "3", "-m", "5", "--p2p-ms", "1"]) == 0
    out = capsys.readouterr().out  # equal stages: the formula, whatever the hand-offs cost the prediction
    assert "theory ((p-1)/(m+p-1)): 28.6%" in out and "predicted step time 221.00 ms" in out, out
    assert main(["schedule", "zb_h1", "-p", "4", "-m", "8", "--fwd", "1", "--bwd", "2", "--wgrad", "1"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("bubble (idle share of the step): simulated 15.8%, theory (p-1)/(3m+p-1)"), line
    assert line.endswith(
        "= 11.1% at the equal costs it assumes; as a share of the ideal time: simulated 18.8%, theory 12.5%"
    )
