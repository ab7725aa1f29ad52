"""Both costs in a plan: every candidate carries its synchronous step (every rank starting
together) and its steady-state step (the longest rank's own span, never longer); --rank-by
steady ranks by the latter (zbv, whose later ranks start late, gains on it). The short forms
-p, -m, -v of ppx plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ppx.cli import parser
from ppx.commands.plan_inputs import from_flags
from ppx.plan.inputs import PlanInputs
from ppx.plan.search import search
from ppx.plan.space import candidates

P, M = 4, 8
INPUTS = PlanInputs(fwd_s=(0.01,) * P, bwd_s=(0.01,) * P, wgrad_s=(0.01, 0.01, 0.01, 0.015), stages=P)


def plan(given: PlanInputs):
    cands, _ = candidates(["1f1b", "zb_h1", "zbv", "interleaved_zb"], [P], [M], [3, 4], given)
    return search(cands, given, jobs=1)[0]


def test_both_steps_and_the_ranking_flag():
    sync = plan(INPUTS)
    steady = plan(replace(INPUTS, rank_by="steady"))
    assert all(r.steady_s <= r.step_s * (1 + 1e-12) for r in sync)
    assert any(r.steady_s < r.step_s * 0.99 for r in sync)  # the later ranks start later
    assert [r.ranked_s for r in sync] == sorted(r.step_s for r in sync)
    assert [r.ranked_s for r in steady] == sorted(r.steady_s for r in steady)
    assert [r.label() for r in sync] != [r.label() for r in steady]
    assert all(r.to_json()["steady_s"] == r.steady_s for r in steady)


def test_short_forms():
    args = parser().parse_args(["plan", "-p", "4", "-m", "8,16", "-v", "2", "--fwd-ms", "1", "--bwd-ms", "1"])
    assert (args.stages, args.microbatches, args.virtual, args.rank_by) == ("4", "8,16", "2", "sync")
    inputs, ps, ms = from_flags(args)
    assert (ps, ms, inputs.stages) == ([4], [8, 16], 4)


def test_a_run_with_a_whole_stage_plans_the_candidates_that_run_it_whole_too():
    """A run whose stage 0 ran whole (its W measured nothing) costs a candidate rightly only
    where the candidate runs that stage whole too (ZB-H1's and ZB-H2's first stage) or does not
    split it: the rest of the split candidates are refused with the reason, and the note's
    calibration run stores on every stage."""
    from ppx.plan.calibrate import refused_split_note, split_calibration

    two = PlanInputs(fwd_s=(0.01,) * 2, bwd_s=(0.01,) * 2, wgrad_s=(0.005,) * 2, stages=2, whole_stages=(0,))
    names = ["1f1b", "zb_h1", "zb_h2", "zbv", "interleaved_zb", "zb_auto"]
    cands, skipped = candidates(names, [2], [8], [1, 2], two)
    # interleaved zero bubble at v=1 too: its first stage runs whole, its stages are the run's
    assert sorted({(c.schedule, c.v) for c in cands}) == [
        ("1f1b", 1),
        ("interleaved_zb", 1),
        ("zb_h1", 1),
        ("zb_h2", 1),
    ]
    why = {(s.schedule, s.v): s.reason for s in skipped}
    assert "ran whole, and 4 stages cut the run's 2 otherwise" in why[("zbv", 2)]
    assert "zb_auto's order is not known" in why[("zb_auto", 1)]
    from ppx import config

    cfg = config.load("transformer_1f1b_2cpu", [])
    note = refused_split_note("runs/x", skipped, (0,), cfg, ran_whole=(0,))
    assert "ran stage 0 whole" in note and "train.split_backward=store" in note
    # where the run did not run it whole itself (a 1F1B run beside a ZB-H1 that did), said so
    other = refused_split_note("runs/x", skipped, (0,), cfg)
    assert "has no I and W measured apart on stage 0, nor have its run.paired entries" in other
    assert "train.split_backward" not in split_calibration("c.yaml") and "store" in split_calibration("c.yaml", "store")
    # without whole stages nothing is refused for them
    plain = candidates(names, [2], [8], [1, 2], replace(two, whole_stages=()))[0]
    assert {("zbv", 2), ("zb_auto", 1)} <= {(c.schedule, c.v) for c in plain}


def test_a_run_beside_the_notes_own_entry_that_stored_more_than_the_graph_is_told_the_graphs_way(tmp_path):
    """The note's storing ZB-H1 entry ran beside the run already and stored stage 0, where auto
    (the plan's commands) keeps the graph, its stores holding more: the plan did not take its I
    and W, and named the same run again. It names the run the graph's way, beside 1F1B as the
    run was; where the entry's stores held less (or it kept no split), the usual run."""
    import json

    from ppx import config
    from ppx.plan.calibrate import refused_split_note

    two = PlanInputs(fwd_s=(0.01,) * 2, bwd_s=(0.01,) * 2, wgrad_s=(0.005,) * 2, stages=2, whole_stages=(0,))
    skipped = candidates(["zbv"], [2], [8], [2], two)[1]
    entry = "pipeline.schedule=zb_h1 train.split_backward=store"
    cfg = config.load("transformer_1f1b_2cpu", [f'run.paired=[pipeline.schedule=1f1b,"{entry}"]'])
    run = tmp_path / "run"
    run.mkdir()
    for store, told in ((2000, True), (700, False)):
        ways = {"0": {"mode": "store", "store_bytes": store, "graph_bytes": 1000}}
        (run / "summary.json").write_text(json.dumps({"paired": {entry: {"split_backward": ways}}}))
        note = refused_split_note(str(run), skipped, (0,), cfg)
        said = (
            f"its entry {entry!r} stored stage 0, where the plan's commands (train.split_backward=auto) keep the graph"
        )
        assert (said in note) == told, note
        graph = f"""`ppx run {run}/config.yaml train.split_backward=graph 'run.paired=[pipeline.schedule=1f1b,"pipeline.schedule=zb_h1 train.split_backward=graph"]' run.dir=null`"""
        assert note.endswith(graph) == told, note


@pytest.mark.parametrize(
    "overrides,way",
    [
        ([], "store"),  # auto would run ZB-H1's first stage whole: store measures its I and W apart
        (["pipeline.split=tracer"], "graph"),  # GraphModules have no Linear to store
        (["model.kind=synthetic"], None),  # the known-cost model sleeps I and W apart already
        (["pipeline.executor=torch"], None),  # torch's executor splits its own way, never whole
    ],
)
def test_the_calibration_run_measures_every_stage_apart(overrides, way):
    from ppx import config
    from ppx.plan.calibrate import calibration_way

    assert calibration_way(config.load("transformer_1f1b_2cpu", overrides)) == way


@pytest.mark.parametrize(
    "overrides,entries",
    [
        ([], '[pipeline.schedule=1f1b,"pipeline.schedule=zb_h1 train.split_backward=store"]'),
        (["model.kind=synthetic"], "[pipeline.schedule=1f1b,pipeline.schedule=zb_h1]"),  # nothing to store
        (["pipeline.stages=2", "parallel.data=2"], None),  # run.paired runs beside one pipeline
        (["pipeline.executor=torch"], None),  # and on ppx's runtime
        (  # 4 stages on 2 ranks: the interleaved schedules, at the run's v
            ["pipeline.schedule=interleaved_1f1b", "pipeline.microbatches=4"],
            '["pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2",'
            '"pipeline.schedule=interleaved_zb pipeline.virtual_stages=2 train.split_backward=store"]',
        ),
        (
            ["train.split_backward=graph"],
            '[pipeline.schedule=1f1b,"pipeline.schedule=zb_h1 train.split_backward=graph"]',
        ),
    ],
)
def test_one_run_measures_what_a_plan_lacks_beside_it(overrides, entries):
    """The run a plan names to measure whole B's and I, W apart is the run's own config with
    1F1B and ZB-H1 beside it, where run.paired can hold them, and the command passes the
    config's checks as printed."""
    import shlex

    from ppx import config
    from ppx.plan.calibrate import beside_command

    cfg = config.load("transformer_1f1b_2cpu", overrides)
    got = beside_command("c.yaml", cfg, whole=True, apart=True)
    if entries is None:
        assert got is None
        return
    assert got == f"ppx run c.yaml 'run.paired={entries}' run.dir=null"
    assert beside_command("c.yaml", cfg) is None  # nothing missing: no run to make
    assert beside_command("my runs/c.yaml", cfg, apart=True).startswith(
        "ppx run 'my runs/c.yaml' "
    )  # as a shell reads it
    keys = shlex.split(got)[3:]
    again = config.load("transformer_1f1b_2cpu", [*overrides, *keys])
    assert len(again.run.paired) == 2


def test_costs_that_include_the_first_step_are_noted():
    from ppx import config
    from ppx.commands.common import first_step_note

    short = config.load("1f1b_2cpu", ["train.steps=5", "instrument.timeline_steps=5"])
    assert "include its first step (train.steps=5, instrument.timeline_steps=5)" in first_step_note("r", short)
    assert first_step_note("r", config.load("1f1b_2cpu", ["train.steps=6", "instrument.timeline_steps=5"])) is None


def test_a_drain_runs_costs_plan_each_split_family_as_drain_runs_it_too():
    """With B's measured apart (a drain run's whole_s), each family that splits is also tried
    as train.split_backward=drain runs it (<name>+drain): its list drained, its B's at the
    measured cost; where drain changes nothing (m = p) that candidate is skipped with why.
    Here the last stage's whole B costs less than its I + W, so the drained list is faster."""
    from ppx.plan.builders import build
    from ppx.plan.evaluate import evaluate
    from ppx.schedules.ir.action import Op
    from ppx.schedules.ir.structure import drain_only

    two = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.5), wgrad_s=(0.5, 1.0), stages=2, whole_s=(None, 2.0))
    cands, _ = candidates(["1f1b", "zb_h1"], [2], [8], [1], two)
    assert [c.schedule for c in cands] == ["1f1b", "zb_h1", "zb_h1+drain"]
    assert build("zb_h1+drain", 2, 8, 1, two).actions == drain_only(build("zb_h1", 2, 8, 1, two)).actions
    got = {c.schedule: evaluate(c, two) for c in cands}
    assert got["zb_h1+drain"].step_s < got["zb_h1"].step_s
    assert any(a.op is Op.B for row in build("zb_h1+drain", 2, 8, 1, two).actions for a in row)
    (few,) = [c for c in candidates(["zb_h1"], [2], [2], [1], two)[0] if c.schedule.endswith("+drain")]
    assert "drain changes nothing at m=2" in evaluate(few, two).reason
    # DualPipeV's W's before a stage's last forward sit on ranks of overlapped cells: kept, and said so
    (dual,) = [c for c in candidates(["dualpipev"], [2], [8], [2], two)[0] if c.schedule.endswith("+drain")]
    assert "sits on a rank of overlapped cells (a cell keeps its I)" in evaluate(dual, two).reason
    assert [c.schedule for c in candidates(["zb_h1"], [2], [8], [1], replace(two, whole_s=None))[0]] == ["zb_h1"]


def test_a_stage_a_candidate_runs_whole_is_priced_at_a_whole_backward():
    """Under train.split_backward=auto ppx's runtime runs a stage whose every I its list follows
    at once by its W as one backward, in the I (ZB-H1's first stage): a plan whose commands run
    auto prices it so, at the B measured apart where there is one (here cheaper than I + W),
    and its I frees everything; with `runs_whole` off (a store run's commands) it is priced
    split, as before."""
    from ppx.plan.evaluate import evaluate
    from ppx.plan.space import Candidate
    from ppx.schedules import Costs
    from ppx.schedules.ir.action import Action, Op

    split = PlanInputs(  # (stage 0 the heavier: its backward decides the step)
        fwd_s=(1.0, 0.5), bwd_s=(1.0, 0.5), wgrad_s=(1.0, 0.5), stages=2, whole_s=(1.5, 0.75), act_bytes=(8.0, 8.0)
    )
    auto = replace(split, runs_whole=True)
    zb = Candidate("zb_h1", 2, 8, 1)
    got, was = evaluate(zb, auto), evaluate(zb, split)
    assert got.step_s < was.step_s  # stage 0's I and W at a B of 1.5, not 1 + 1
    costs = auto.costs(2, {0})
    assert costs.work(Action(0, Op.I, 0)) == 1.5 and costs.work(Action(0, Op.W, 0)) == 0.0
    assert costs.work(Action(1, Op.I, 0)) == 0.5 and costs.work(Action(1, Op.W, 0)) == 0.5
    assert split.costs(2) == auto.costs(2)  # (no stage named whole: the costs as measured)
    # without a B measured apart, a whole stage costs its I + W in the I
    plain = Costs(fwd=1.0, bwd=[1.0, 2.0], wgrad=[0.5, 1.0]).run_whole({1}, 2)
    assert plain.work(Action(1, Op.I, 0)) == 3.0 and plain.work(Action(0, Op.I, 0)) == 1.0
    # 1F1B runs no I: the same either way
    assert evaluate(Candidate("1f1b", 2, 8, 1), auto).step_s == evaluate(Candidate("1f1b", 2, 8, 1), split).step_s


def test_drawn_costs_of_a_stage_run_whole_are_whole_backwards():
    """Drawn from a run's samples, a candidate stage run whole costs a B in its I (the B's drawn
    where measured, else an I and a W) and nothing in its W; the other stages as measured; a
    stage made of parts of two run stages adds each part's."""
    from ppx.plan.sampled import PlanSamples
    from ppx.schedules.ir.action import Action, Op

    samples = {
        "action_s": {"0F": [1.0], "0B": [2.5], "0I": [2.0], "0W": [1.0], "1F": [1.0], "1I": [2.0], "1W": [1.5]},
        "p2p_s": [],
        "overhead_s": [],
    }
    got = PlanSamples(samples, [((0, 1, 1),), ((1, 1, 1),)], whole={0})
    assert got.work(Action(0, Op.I, 0)) == 2.5 and got.work(Action(0, Op.W, 0)) == 0.0
    assert got.work(Action(1, Op.I, 0)) == 2.0 and got.work(Action(1, Op.W, 0)) == 1.5
    both = PlanSamples(samples, [((0, 1, 2), (1, 1, 2))], whole={0})
    assert both.work(Action(0, Op.I, 0)) == pytest.approx(2.5 / 2 + (2.0 + 1.5) / 2)
    assert PlanSamples(samples, [((0, 1, 1),)]).work(Action(0, Op.I, 0)) == 2.0  # (not whole: as measured)


def test_a_run_whose_steps_spread_widely_is_noted():
    """A quiet run's steps spread 5-7% (their middle half over their median); a busy machine's
    35%: a plan or simulation from it says so. The first step (set-up) is left out."""
    from ppx.commands.common import noisy_run_note

    quiet = [0.5] + [0.036, 0.037, 0.038, 0.036, 0.039, 0.037, 0.038, 0.036]
    assert noisy_run_note("runs/x", quiet) is None
    busy = [0.5] + [0.040, 0.072, 0.055, 0.090, 0.048, 0.080, 0.061, 0.045]
    note = noisy_run_note("runs/x", busy)
    assert note.startswith("note: runs/x's steps spread widely") and "run it again on a quiet machine" in note
    assert noisy_run_note("runs/x", busy[:4]) is None  # (too few steps to tell)
    # one stall among quiet steps moves no quartile: it is named (it weighs in every draw)
    stalled = [0.5, 0.0130, 0.0133, 0.155, 0.0135, 0.0132]
    note = noisy_run_note("runs/x", stalled)
    assert "(step 3 155.0 ms against a median of 13.3 ms, a stall)" in note, note
    assert noisy_run_note("runs/x", [0.5, 0.0130, 0.0133, 0.0250, 0.0135, 0.0132]) is None  # (under 2x)


def test_a_candidate_with_more_stages_than_the_run_is_noted():
    from ppx.commands.plan import regrouped_note
    from ppx.plan.evaluate import Result

    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.0), wgrad_s=(0.5, 0.5), stages=2)
    shown = [Result(s, 2, 8, v, 1.0, 0.0, (0.0, 0.0), True) for s, v in (("zbv", 2), ("1f1b", 1), ("zb_h1", 1))]
    note = regrouped_note("runs/x", shown, inputs)
    assert note.startswith("note: zbv p=2 m=8 v=2 run more stages than the 2 runs/x measured")
    assert "; the best, zbv p=2 m=8 v=2, is one of them: its place is the regrouping's;" in note  # (ranked first)
    assert "the best" not in regrouped_note("runs/x", [shown[1], shown[0]], inputs)
    assert regrouped_note("runs/x", shown[1:], inputs) is None
    # an entry beside the run measured ZB-V's 4 stages: priced as they ran, not regrouped
    assert regrouped_note("runs/x", shown, _with_zbv_measured()) is None


def test_the_run_that_prices_more_stages_as_they_run():
    """Regrouped candidates get the command that runs them beside the run (after its own
    entries), each as the plan names it: its default v left out, +drain as drain runs it; none
    where an entry cannot run beside it (data parallel)."""
    import shlex

    from ppx import config
    from ppx.commands.plan import regrouped_note
    from ppx.config.paired import variants
    from ppx.plan.calibrate import stage_count_command
    from ppx.plan.evaluate import Result

    cfg = config.load("transformer_1f1b_2cpu", ["run.paired=[pipeline.schedule=zb_h1]", "model.layers=6"])
    shown = [("zbv", 2), ("zbv+drain", 2), ("interleaved_1f1b", 3), ("zbv", 2)]
    got = stage_count_command("my runs/c.yaml", cfg, shown)
    entries = [
        "pipeline.schedule=zb_h1",
        "pipeline.schedule=zbv",
        "pipeline.schedule=zbv train.split_backward=drain",
        "pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=3",
    ]
    words = shlex.split(got)
    assert words[:3] == ["ppx", "run", "my runs/c.yaml"] and words[-1] == "run.dir=null"
    ran = config.load("transformer_1f1b_2cpu", ["model.layers=6", *words[3:-1]])
    assert [e for e, _ in variants(ran)] == entries  # (as ppx run checks them)
    assert stage_count_command("c.yaml", config.load("transformer_1f1b_2cpu", ["parallel.data=2"]), shown) is None
    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.0), wgrad_s=(0.5, 0.5), stages=2)
    result = Result("zbv", 2, 8, 2, 1.0, 0.0, (0.0, 0.0), True)
    note = regrouped_note("runs/x", [result], inputs, cfg)
    assert note.endswith(
        "`ppx run runs/x/config.yaml 'run.paired=[pipeline.schedule=zb_h1,pipeline.schedule=zbv]' run.dir=null`"
    )


def _with_zbv_measured(units=(2, 2, 1, 1)) -> PlanInputs:
    """A 2-stage run of 6 units (3 and 3: 1 ms F and 2 ms B a unit) whose ZB-V entry measured
    4 stages holding ``units`` (the even split's 2, 2, 1, 1 as the candidate's command runs
    them): a unit's F 1.1 ms, I 1.65 ms and W 0.55 ms (stage 0 run whole: its B), 10% above
    the run's (a stage's own cost per call)."""
    from ppx.plan.inputs import MeasuredAt

    own = {"action_s": {"0F": [3e-3], "0B": [6e-3], "1F": [3e-3], "1B": [6e-3]}, "p2p_s": [1e-4], "overhead_s": [0.0]}
    at = {
        f"{st}{op}": [n * ms / 1e3] for st, n in enumerate(units) for op, ms in (("F", 1.1), ("I", 1.65), ("W", 0.55))
    }
    at = {k: v for k, v in at.items() if k not in ("0I", "0W")} | {"0B": [units[0] * 2.2e-3]}
    return PlanInputs(
        fwd_s=(3e-3, 3e-3),
        bwd_s=(6e-3, 6e-3),
        wgrad_s=(0.0, 0.0),
        stages=2,
        act_bytes=(3000.0, 3000.0),
        samples=own,
        run_units=(3, 3),
        runs_whole=True,
        measured_at=(MeasuredAt(4, units, at, ("pipeline.schedule=zbv",)),),
    )


def _timed_at(inputs: PlanInputs, num_stages: int, apart: set[int] = frozenset()) -> PlanInputs:
    """The inputs evaluate times a candidate of ``num_stages`` with I and W apart on ``apart`` by."""
    m = inputs.measured_for(num_stages, apart)
    return inputs if m is None else inputs.timed_on(m)


def test_an_entry_at_a_candidates_stage_count_times_it_as_the_entry_ran():
    """ZB-V's 4 stages from a ZB-V entry beside a 1F1B run: the entry's own F, I, W (whole B on
    stage 0), not the run's stages regrouped; bytes stay the run's, regrouped. Where the entry's
    stages held other units, or it ran whole a stage the candidate splits apart, regrouped."""
    from ppx.plan.evaluate import evaluate
    from ppx.plan.space import Candidate

    inputs = _with_zbv_measured()
    timed = _timed_at(inputs, 4, {1, 2, 3})
    assert timed is not inputs and timed.stages == 4 and timed.run_units is None
    assert timed.fwd_s == pytest.approx((2.2e-3, 2.2e-3, 1.1e-3, 1.1e-3))
    assert timed.wgrad_s == pytest.approx((0.0, 1.1e-3, 0.55e-3, 0.55e-3))
    assert timed.bwd_s[0] == pytest.approx(4.4e-3) and timed.samples["action_s"]["3W"] == [0.55e-3]
    assert timed.act_bytes == pytest.approx((2000.0, 2000.0, 1000.0, 1000.0))  # the run's, regrouped
    assert timed.samples["p2p_s"] == [1e-4]  # (hand-offs: the run's)
    assert _timed_at(inputs, 4, {0, 1, 2, 3}) is inputs  # stage 0 apart: the entry ran it whole
    assert _timed_at(_with_zbv_measured(units=(1, 2, 2, 1)), 4, {1, 2, 3}).stages == 2  # other units: regrouped
    assert _timed_at(inputs, 2) is inputs
    zbv = evaluate(Candidate("zbv", 2, 8, 2), inputs)
    regrouped = evaluate(Candidate("zbv", 2, 8, 2), _with_zbv_measured(units=(1, 2, 2, 1)))
    assert zbv.step_s > regrouped.step_s * 1.05  # each stage 10% dearer than its units' share
    assert zbv.timed_by == ("pipeline.schedule=zbv",) and regrouped.timed_by == ()  # (plan.json says which)
    assert zbv.peak_bytes == regrouped.peak_bytes


def test_a_run_that_never_split_plans_what_an_entry_ran_at_its_stage_count():
    """A 1F1B run (no I, W of its own) with ZB-V beside it: ZB-V is planned on the entry's
    actions; ZB-H1 (2 stages, the run's own count) is still refused, and so is ZB-V where the
    entry's stages held other units than the candidate's."""
    from ppx.plan.space import SPLIT_REASON

    never = replace(_with_zbv_measured(), split_known=False)
    got, skipped = candidates(["zbv", "zb_h1", "1f1b"], [2], [8], [2], never)
    assert {c.schedule for c in got} == {"zbv", "1f1b"}
    assert [s.schedule for s in skipped if s.reason.startswith(SPLIT_REASON)] == ["zb_h1"]
    other = replace(_with_zbv_measured(units=(1, 2, 2, 1)), split_known=False)
    assert {c.schedule for c in candidates(["zbv"], [2], [8], [2], other)[0]} == set()
    whole = replace(_with_zbv_measured(), whole_stages=(0,))  # (a ZB-H1 run under auto: stage 0 whole)
    assert {c.schedule for c in candidates(["zbv"], [2], [8], [2], whole)[0]} == {"zbv"}
