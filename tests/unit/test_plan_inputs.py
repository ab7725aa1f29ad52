"""`PlanInputs`: per-layer costs summed over the layers each stage gets, per-stage costs cut
into v equal parts (or summed in groups for fewer stages), and the shapes that cannot be split."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ppx.models.split import split_layers
from ppx.plan.inputs import PlanInputs


def test_per_layer_costs_sum_over_the_split():
    layers = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    inputs = PlanInputs(fwd_s=tuple(layers), bwd_s=tuple(2 * x for x in layers), wgrad_s=(0.0,) * 7, per_layer=True)
    for n in (1, 2, 3, 7):
        want = [sum(layers[i] for i in r) for r in split_layers(7, n)]
        assert inputs.costs(n).fwd == want
        assert inputs.costs(n).bwd == [2 * x for x in want]
        assert sum(inputs.costs(n).fwd) == pytest.approx(sum(layers))  # the same work at every p
    assert inputs.why_not(8) and "7 layers" in inputs.why_not(8)
    assert inputs.why_not(7) is None


def test_per_stage_costs_cut_into_v_equal_parts():
    inputs = PlanInputs(
        fwd_s=(0.010, 0.020),
        bwd_s=(0.030, 0.040),
        wgrad_s=(0.0, 0.008),
        stages=2,
        act_bytes=(100.0, 300.0),
        param_bytes=(10.0, 20.0),
    )
    c = inputs.costs(6)  # v = 3: stages 0-2 are stage 0's thirds, 3-5 stage 1's
    assert c.fwd == pytest.approx([0.010 / 3] * 3 + [0.020 / 3] * 3)
    assert c.wgrad == pytest.approx([0.0] * 3 + [0.008 / 3] * 3)
    assert inputs.act(4) == [50.0, 50.0, 150.0, 150.0]
    assert inputs.params(4) == [5.0, 5.0, 10.0, 10.0]
    assert inputs.costs(2).fwd == [0.010, 0.020]


def test_per_stage_costs_of_more_stages_merge_for_fewer():
    inputs = PlanInputs(fwd_s=(1.0, 2.0, 3.0, 4.0), bwd_s=(1.0,) * 4, wgrad_s=(0.0,) * 4, stages=4)
    assert inputs.costs(2).fwd == [3.0, 7.0]
    assert inputs.why_not(6) and inputs.why_not(8) is None and inputs.why_not(2) is None


def test_a_runs_stages_regroup_by_their_model_units_and_weights():
    """A run's 2 stages of 3 units each (llama-tiny: embedding, 2 blocks | 2 blocks, head) at 4
    stages hold 2, 2, 1, 1 units, as the printed command splits them: stage 1 takes a unit of
    each run stage. Each unit takes its run stage's values by its weight; without weights, in
    equal shares; every candidate adds up to the run's totals."""
    from ppx.plan.unit_weights import UnitWeights

    weights = UnitWeights(flops=(0, 4, 4, 4, 4, 2), saved_bytes=(1, 10, 10, 10, 10, 5), param_bytes=(3, 2, 2, 2, 2, 3))
    inputs = PlanInputs(
        fwd_s=(8.0, 10.0),
        bwd_s=(16.0, 20.0),
        wgrad_s=(0.0, 0.0),
        stages=2,
        act_bytes=(21.0, 25.0),
        param_bytes=(7.0, 7.0),
        input_share=(0.5, 0.2),
        run_units=(3, 3),
        unit_weights=weights,
    )
    assert inputs.parts(4) == [((0, 4, 8),), ((0, 4, 8), (1, 4, 10)), ((1, 4, 10),), ((1, 2, 10),)]
    assert inputs.costs(4).fwd == pytest.approx([4.0, 4.0 + 4.0, 4.0, 2.0])
    assert inputs.act(4) == pytest.approx([11.0, 10.0 + 10.0, 10.0, 5.0])
    assert inputs.params(4) == pytest.approx([5.0, 2.0 + 2.0, 2.0, 3.0])
    # each unit keeps its run stage's share: stage 1 frees half of its run-stage-0 bytes and a fifth of the rest
    assert inputs.shares(4) == pytest.approx([0.5, (5.0 + 2.0) / 20.0, 0.2, 0.2])
    for n in (4, 5, 6):  # 5: the units regroup whatever the counts (the stage count need not divide)
        assert sum(inputs.costs(n).fwd) == pytest.approx(18.0) and sum(inputs.act(n)) == pytest.approx(46.0)

        assert inputs.why_not(n) is None
    assert inputs.costs(2).fwd == [8.0, 10.0]  # the run's own split
    # the data-parallel reduction moves gradients: it follows the parameter bytes, not the FLOPs
    # (the embedding, 0 FLOPs, holds 3 of its run stage's 7 parameter bytes)
    reducing = replace(inputs, reduce_s=(7.0, 14.0))
    assert reducing.costs(4).reduce == pytest.approx([5.0, 2.0 + 4.0, 4.0, 6.0])
    equal = PlanInputs(fwd_s=(6.0, 9.0), bwd_s=(0.0,) * 2, wgrad_s=(0.0,) * 2, stages=2, run_units=(3, 3))
    assert equal.costs(4).fwd == pytest.approx([4.0, 2.0 + 3.0, 3.0, 3.0])
    # a run stage whose units all weigh 0 (a stage of the embedding alone) shares equally
    three = UnitWeights(flops=(0, 4, 2), saved_bytes=(0, 4, 2), param_bytes=(0, 4, 2))
    alone = PlanInputs(
        fwd_s=(1.0, 9.0), bwd_s=(0.0,) * 2, wgrad_s=(0.0,) * 2, stages=2, run_units=(1, 2), unit_weights=three
    )
    assert alone.costs(3).fwd == pytest.approx([1.0, 6.0, 3.0])


def test_a_runs_stages_regroup_as_a_balanced_split_runs_them():
    """Under pipeline.balance=flops (the run's ``split_weights``) the printed command splits
    llama-tiny's 6 units as 2, 1, 1, 2 at 4 stages (the head, a third of a block, rides with
    the last block): the candidate's stages take those units' shares of the run's stages, by
    their FLOPs for the times where no unit weights were had (the embedding's none), equal
    shares for the bytes."""
    inputs = PlanInputs(
        fwd_s=(8.0, 10.0),
        bwd_s=(16.0, 20.0),
        wgrad_s=(0.0, 0.0),
        stages=2,
        run_units=(3, 3),
        split_weights=(0.0, 3.0, 3.0, 3.0, 3.0, 1.0),
    )
    assert inputs.parts(4, "bytes") == [((0, 2, 3),), ((0, 1, 3),), ((1, 1, 3),), ((1, 2, 3),)]
    assert inputs.parts(4) == [((0, 3.0, 6.0),), ((0, 3.0, 6.0),), ((1, 3.0, 7.0),), ((1, 4.0, 7.0),)]
    assert inputs.costs(4).fwd == pytest.approx([4.0, 4.0, 10.0 * 3 / 7, 10.0 * 4 / 7])
    assert PlanInputs.from_json(inputs.to_json()).parts(4) == inputs.parts(4)


def test_unknown_bytes_are_zero():
    inputs = PlanInputs(fwd_s=(1.0,), bwd_s=(1.0,), wgrad_s=(0.0,), stages=1)
    assert inputs.act(2) == [0.0, 0.0] and inputs.params(2) == [0.0, 0.0]


def test_the_known_cost_overrides_carry_the_candidates_stage_costs():
    from ppx.plan.evaluate import Result
    from ppx.plan.howto import synthetic_overrides

    inputs = PlanInputs(fwd_s=(0.010, 0.020), bwd_s=(0.010,) * 2, wgrad_s=(0.0,) * 2, stages=2)
    best = Result("zbv", 2, 4, 2, 1.0, 0.0, (0.0, 0.0), True)
    assert synthetic_overrides(best, inputs) == [
        "model.kind=synthetic",
        "model.layers=4",
        "model.cost_per=stage",
        "model.fwd_ms=[5,5,10,10]",
        "model.bwd_ms=5",
        "model.wgrad_ms=0",
        "train.batch_size=4",
    ]


@pytest.mark.parametrize(
    "way,schedule,extra",
    [
        ("drain", "zb_h1", ["train.split_backward=auto"]),
        ("drain", "1f1b", ["train.split_backward=auto"]),
        ("store", "zb_h1", []),
        ("store", "1f1b", ["train.split_backward=auto"]),
        ("auto", "zb_h1", []),
    ],
)
def test_a_plans_commands_run_every_candidate_as_it_was_costed(way, schedule, extra):
    """A plan costs each candidate's list as its family builds it: from a drain run (whose
    lists would change under drain) or for a candidate that splits nothing, the command says
    train.split_backward=auto; a storing run's split candidates keep store (costed so)."""
    from ppx import config
    from ppx.plan.evaluate import Result
    from ppx.plan.howto import from_run_overrides

    cfg = config.load("llama_tiny_1f1b_2cpu", ["pipeline.schedule=zb_h1", f"train.split_backward={way}"])
    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.0), wgrad_s=(0.5, 0.5), stages=2)
    best = Result(schedule, 2, cfg.pipeline.microbatches, 1, 1.0, 0.0, (0.0, 0.0), True)
    assert from_run_overrides(best, cfg, inputs) == ["run.dir=null", *extra]


def test_the_share_an_input_pass_frees_follows_the_bytes_onto_any_stage_count():
    """A run whose split backward stores frees part of each microbatch at I: merged stages free
    the byte-weighted share of theirs, cut ones their stage's."""
    inputs = PlanInputs(
        fwd_s=(1, 1), bwd_s=(1, 1), wgrad_s=(1, 1), stages=2, act_bytes=(100, 300), input_share=(0.5, 0.25)
    )
    assert inputs.shares(2) == [0.5, 0.25]
    assert inputs.shares(1) == [pytest.approx((50 + 75) / 400)]
    assert inputs.shares(4) == [0.5, 0.5, 0.25, 0.25]
    assert PlanInputs(fwd_s=(1,), bwd_s=(1,), wgrad_s=(1,), stages=1, act_bytes=(8,)).shares(2) == [0.0, 0.0]


def test_a_candidates_peak_counts_what_its_input_passes_free():
    from ppx.plan.evaluate import evaluate
    from ppx.plan.space import Candidate

    base = dict(fwd_s=(1e-3,) * 2, bwd_s=(1e-3,) * 2, wgrad_s=(1e-3,) * 2, stages=2, act_bytes=(100.0, 100.0))
    keep = evaluate(Candidate("zb_h1", 2, 4, 1), PlanInputs(**base))
    free = evaluate(Candidate("zb_h1", 2, 4, 1), PlanInputs(**base, input_share=(0.75, 0.75)))
    assert all(f <= k for f, k in zip(free.peak_bytes, keep.peak_bytes))
    assert sum(free.peak_bytes) < sum(keep.peak_bytes)


def test_an_input_pass_that_adds_is_counted_and_zb_auto_still_builds():
    """Under train.recompute a run's I re-runs the forward and holds more than the forward
    saved until W (a negative share): a candidate's walk holds it, and zb_auto, whose own
    accounting has no I that adds, still builds (placing as if the I held nothing more)."""
    from ppx.plan.builders import build
    from ppx.plan.evaluate import evaluate
    from ppx.plan.space import AUTO, Candidate
    from ppx.schedules.sim.memory import peak_held

    base = dict(fwd_s=(1e-3,) * 2, bwd_s=(1e-3,) * 2, wgrad_s=(1e-3,) * 2, stages=2, act_bytes=(100.0, 100.0))
    keep = evaluate(Candidate("zb_h1", 2, 4, 1), PlanInputs(**base))
    adds = evaluate(Candidate("zb_h1", 2, 4, 1), PlanInputs(**base, input_share=(-9.0, -9.0)))
    assert all(a >= 1000 > k for a, k in zip(adds.peak_bytes, keep.peak_bytes))  # an I holds 10x what F saved
    inputs = PlanInputs(**base, input_share=(-9.0, -9.0))
    auto = evaluate(Candidate(AUTO, 2, 4, 1), inputs)
    assert auto.peak_bytes == tuple(peak_held(build(AUTO, 2, 4, 1, inputs), [100.0, 100.0], [-9.0, -9.0]))


def test_plan_json_inputs_read_back():
    import json

    from ppx.plan.unit_weights import UnitWeights

    w = UnitWeights(flops=(0.0, 4.0), saved_bytes=(1.0, 10.0), param_bytes=(3.0, 2.0))
    inputs = PlanInputs(
        fwd_s=(1.0,), bwd_s=(2.0,), wgrad_s=(0.5,), stages=1, run_units=(2,), unit_weights=w, samples={"action_s": {}}
    )
    back = PlanInputs.from_json(json.loads(json.dumps(inputs.to_json())))
    assert back == replace(inputs, samples=None)
    # what a stage keeps under recomputation and the tied weights, and a per-stage recompute run's key
    w = replace(w, input_bytes=(8.0, 6.0), kept_bytes=(0.0, 5.0), target_bytes=2.0, shared=(((0, 1), 1.0),))
    inputs = replace(inputs, unit_weights=w, recompute="full", fixed_stages=1, fixed_by="train.recompute")
    back = PlanInputs.from_json(json.loads(json.dumps(inputs.to_json())))
    assert back == replace(inputs, samples=None) and back.unit_weights.of_stage(range(2), "params") == [3.0, 1.0]
    old = json.loads(json.dumps(inputs.to_json()))  # (a plan.json from before they were kept)
    for key in ("input_bytes", "kept_bytes", "target_bytes", "shared"):
        del old["unit_weights"][key]
    assert PlanInputs.from_json(old).unit_weights.of_stage(range(2), "bytes", "full") == [1.0, 10.0]


def test_bytes_a_run_measured_two_stages_save_between_them_price_its_own_stage_count_only():
    import json

    from ppx.plan.inputs import shared_of_run

    ran = {"2": {"bytes": 2048, "until": "a W"}}  # (summary.json's shared_with_stage_before)
    inputs = PlanInputs(fwd_s=(1.0,) * 4, bwd_s=(1.0,) * 4, wgrad_s=(0.0,) * 4, stages=4, **shared_of_run(ran, 4))
    assert inputs.shared(4) == [None, None, (2048.0, "a W"), None]
    assert inputs.shared(2) is None  # (other cuts: not measured, each stage's counted whole)
    assert PlanInputs.from_json(json.loads(json.dumps(inputs.to_json()))).shared(4) == inputs.shared(4)
    assert shared_of_run(None, 4) == {} and PlanInputs(fwd_s=(1.0,), bwd_s=(1.0,), wgrad_s=(0.0,)).shared(1) is None


def test_no_candidate_begins_a_stage_after_a_unit_that_hands_on_integers():
    """Your module's unit 0 hands on integers (bins, then their embedding): a candidate whose
    split of the run's units would begin a stage after it cannot run (its config is refused),
    and is said so; counts whose split cuts elsewhere, and the run's own, stay."""
    import json

    inputs = PlanInputs(
        fwd_s=(3.0, 1.0), bwd_s=(3.0, 1.0), wgrad_s=(0.0, 0.0), stages=2, run_units=(3, 1), no_cut_after=(0,)
    )
    assert inputs.why_not(4) == (
        "4 stages would begin one after unit 0, which hands on integers or booleans (a stage receives floating "
        "point): it cannot run"
    )
    assert inputs.why_not(2) is None and inputs.why_not(1) is None
    assert inputs.why_not(3) is None  # (4 units into 3, evenly: [2, 1, 1])
    weighed = replace(inputs, split_weights=(4.0, 1.0, 1.0, 1.0))  # (as the run's command splits them: [1, 1, 2])
    assert weighed.why_not(3).startswith("3 stages would begin one after unit 0, ")
    assert PlanInputs.from_json(json.loads(json.dumps(inputs.to_json()))).no_cut_after == (0,)


def test_a_drain_runs_measured_b_prices_the_bs_of_every_candidate():
    """A drain run measured B apart from I + W on its split stage: a candidate's B there costs
    the B (a whole backward pays no split), elsewhere I + W; cut or merged as the times are;
    plan.json's inputs keep it."""
    from ppx.schedules.ir.action import Action, Op

    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(2.0, 2.0), wgrad_s=(1.0, 1.0), stages=2, whole_s=(None, 2.5))
    two = inputs.costs(2)
    assert two.work(Action(1, Op.B, 0)) == 2.5 and two.work(Action(0, Op.B, 0)) == 3.0
    assert two.work(Action(1, Op.I, 0)) == 2.0 and two.work(Action(1, Op.W, 0)) == 1.0
    assert inputs.costs(4).whole == [1.5, 1.5, 1.25, 1.25] and inputs.costs(1).whole == [5.5]
    assert PlanInputs.from_json(inputs.to_json()).whole_s == (None, 2.5)
    assert replace(inputs, whole_s=None).costs(2).whole is None


@pytest.mark.parametrize("m, batch", [(4, None), (8, 32), (2, 8)])
def test_a_plans_command_at_another_m_keeps_the_runs_microbatch_size(m, batch):
    """The plan costs a candidate at the run's microbatch size (its measured costs are per
    microbatch): at another m the command sets the batch that keeps it, even where the run's
    batch would divide (16 into 8 microbatches of 2: not what was planned)."""
    from ppx import config
    from ppx.plan.evaluate import Result
    from ppx.plan.howto import from_run_overrides

    cfg = config.load("llama_tiny_1f1b_2cpu", [])  # m=4, batch 16: microbatches of 4
    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.0), wgrad_s=(0.5, 0.5), stages=2)
    best = Result("1f1b", 2, m, 1, 1.0, 0.0, (0.0, 0.0), True)
    assert from_run_overrides(best, cfg, inputs) == ["run.dir=null"] + ([f"train.batch_size={batch}"] if batch else [])


def test_a_candidate_of_one_stage_a_rank_takes_no_v_from_a_run_that_set_one():
    """A run with pipeline.virtual_stages=2 (an interleaved run, a plan's best run as printed):
    1F1B from it says v=null, or it would inherit the run's 2 and fail its checks."""
    from ppx import config
    from ppx.plan.evaluate import Result
    from ppx.plan.howto import check, from_run_overrides, run_overrides

    cfg = config.load("llama_tiny_1f1b_2cpu", ["pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"])
    inputs = PlanInputs(fwd_s=(1.0,) * 4, bwd_s=(1.0,) * 4, wgrad_s=(0.0,) * 4, stages=4)
    one = Result("1f1b", 2, cfg.pipeline.microbatches, 1, 1.0, 0.0, (0.0, 0.0), True)
    extra = from_run_overrides(one, cfg, inputs)
    assert "pipeline.virtual_stages=null" in extra
    run = ["ppx run", "llama_tiny_1f1b_2cpu", "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"]
    assert check(" ".join([*run, *run_overrides(one, "1f1b"), *extra])) is None  # as the run's config.yaml would
    assert "pipeline.virtual_stages=null" not in from_run_overrides(
        Result("zbv", 2, 4, 2, 1.0, 0.0, (0.0, 0.0), True), cfg, inputs
    )


def test_a_printed_run_command_reads_back_as_a_shell_reads_it(tmp_path):
    """A path with a space (the run's config, the plan's CSV) is quoted in the printed command,
    and `check` reads it back as the shell would: the config loads."""
    import shlex

    from ppx import config
    from ppx.plan.howto import check, run_command

    where = tmp_path / "my runs"
    where.mkdir()
    (where / "config.yaml").write_text(config.to_yaml(config.load("1f1b_2cpu", [])))
    keys = ["pipeline.microbatches=8", "pipeline.layers_per_stage=[3,1]", f"run.root={where}"]
    text = run_command(str(where / "config.yaml"), keys)
    assert shlex.split(text) == ["ppx", "run", str(where / "config.yaml"), *keys]
    assert "pipeline.layers_per_stage=[3,1]" in text.split()  # (a list's brackets bare, as the docs write them)
    assert check(text) is None
    assert "microbatches" in check(run_command(str(where / "config.yaml"), ["pipeline.microbatches=3"]))


def _ran(param_bytes, optimizer="sgd", *overrides):
    """What `_run_params` reads of a run directory: its ranks' rows and its config."""
    from types import SimpleNamespace

    from ppx import config

    return SimpleNamespace(
        raw_summary={"ranks": [{"rank": r, "param_bytes": b} for r, b in enumerate(param_bytes)]},
        config=config.load(None, [f"train.optimizer={optimizer}", *overrides]),
    )


@pytest.mark.parametrize("optimizer, per_weight", [("sgd", 2), ("adamw", 4)])
def test_a_runs_weights_hold_their_gradients_and_optimizer_state(optimizer, per_weight):
    from ppx.commands.plan_inputs import _run_params

    assert _run_params(_ran([100, 300], optimizer), 2, None, None) == (100 * per_weight, 300 * per_weight)


@pytest.mark.parametrize("schedule, owner", [("interleaved_1f1b", (0, 1, 0, 1)), ("zbv", (0, 1, 1, 0))])
def test_a_runs_ranks_of_several_stages_share_their_own_weights_by_their_units(schedule, owner):
    from ppx.commands.plan_inputs import _run_params
    from ppx.plan.unit_weights import UnitWeights

    # 4 stages on 2 ranks: units 1 | 2 | 2 | 1, weighing 3 | 2+2 | 2+2 | 3; rank 0 measured 50
    # bytes, rank 1 90 (tied weights, say: what the units weigh does not say what a rank holds)
    w = UnitWeights(flops=(0, 4, 4, 4, 4, 2), saved_bytes=(1, 10, 10, 10, 10, 5), param_bytes=(3, 2, 2, 2, 2, 3))
    ran = _ran([50, 90], "sgd", f"pipeline.schedule={schedule}", "pipeline.virtual_stages=2")
    held = _run_params(ran, 4, (1, 2, 2, 1), w)
    rank = [2 * 50, 2 * 90]
    mine = {r: sum((3, 4, 4, 3)[s] for s in range(4) if owner[s] == r) for r in (0, 1)}
    assert held == pytest.approx([rank[owner[s]] * (3, 4, 4, 3)[s] / mine[owner[s]] for s in range(4)])
    assert [sum(h for h, o in zip(held, owner) if o == r) for r in (0, 1)] == pytest.approx(rank)
    plain = _run_params(ran, 4, (1, 2, 2, 1), None)  # (no weights: equal shares of each rank's)
    assert plain == pytest.approx([rank[owner[s]] / 2 for s in range(4)])
    older = _ran([70, 70])
    del older.raw_summary["ranks"][0]["param_bytes"]  # (a run without memory counters)
    assert _run_params(older, 2, None, None) is None


def test_a_csv_that_puts_stage_0_on_rank_1_gives_each_stage_its_own_ranks_weights(tmp_path):
    from ppx.commands.plan_inputs import _run_params

    (tmp_path / "swapped.csv").write_text("1F0,1F1,1B0,1B1\n0F0,0F1,0B0,0B1\n")  # row r: rank r's list
    ran = _ran([50, 90], "sgd", f"pipeline.schedule={tmp_path / 'swapped.csv'}", "pipeline.microbatches=2")
    assert _run_params(ran, 2, None, None) == (2 * 90, 2 * 50)  # stage 0 on rank 1, stage 1 on rank 0


def test_a_run_with_a_recompute_mode_per_stage_plans_its_own_stage_count_only():
    """A candidate's command of another stage count had as many modes as the run had stages,
    which its config checks refuse: it was ranked (best, at p=4) with peaks of mixed modes."""
    from ppx import config
    from ppx.commands.plan_inputs import _fixed_by, _recompute

    cfg = config.load("llama_tiny_1f1b_2cpu", ["train.recompute=[none,full]"])
    assert (_fixed_by(cfg), _recompute(cfg)) == ("train.recompute", "none")
    cfg = config.load("llama_tiny_1f1b_2cpu", ["train.recompute=[full]"])
    assert (_fixed_by(cfg), _recompute(cfg)) == (None, "full")
    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(2.0, 2.0), wgrad_s=(0.0, 0.0), stages=2, fixed_stages=2)
    assert replace(inputs, fixed_by="train.recompute").why_not(4) == (
        "the run sets train.recompute for 2 stages: 4 cannot run"
    )
    assert replace(inputs, fixed_by="train.recompute").why_not(2) is None
