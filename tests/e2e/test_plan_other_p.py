"""`ppx plan --from-run` at other p than the run's: a one-rank run (one GPU, a laptop) plans
p = 2 and 4 by regrouping its stage's layers, its hand-offs priced at `--p2p-ms` and said so;
a run of several ranks measured its hand-offs and refuses the flag."""

from __future__ import annotations

import json

import pytest

from helpers import PICTURED_1F1B, ppx, read_json

M = 4
# the known-cost model, 4 layers of 5 ms forward and 5 ms backward each, all on one rank
ONE_RANK = [
    "1f1b_2cpu",
    "pipeline.stages=1",
    f"pipeline.microbatches={M}",
    "model.kind=synthetic",
    "model.layers=4",
    "model.cost_per=layer",
    "model.fwd_ms=5",
    "model.bwd_ms=5",
    "model.hidden=16",
    "train.steps=3",
    "train.batch_size=8",
]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    root = tmp_path_factory.mktemp("other_p")
    run = ppx("run", *ONE_RANK, f"run.dir={root / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    other_p = ["--stages", "1,2,4", "--p2p-ms", "0.2", "--schedules", "1f1b,gpipe"]
    r = ppx("plan", "--from-run", str(root / "run"), *other_p, "--out", str(root / "plan"))
    assert r.returncode == 0, r.stderr
    return r.stdout, read_json(root / "plan" / "plan.json"), read_json(root / "run" / "summary.json")


def test_a_one_rank_run_plans_more_ranks_from_its_layers(planned):
    stdout, plan, summary = planned
    step = {(c["schedule"], c["p"]): c["step_s"] for c in plan["candidates"]}
    assert {p for _, p in step} == {1, 2, 4}
    a = summary["measured_costs"]["action_s"]
    f, b = a["0F"], a["0B"]  # the run's one stage: its 4 layers' 20 ms each way
    assert f == pytest.approx(0.020, rel=0.15) and b == pytest.approx(0.020, rel=0.15)
    for p in (2, 4):  # p stages of 4 / p layers each: 1F1B's (m + p - 1)(F + B) / p, p - 1 hand-offs each way
        ideal = (M + p - 1) * (f + b) / p + 2 * (p - 1) * 0.0002
        assert step[("1f1b", p)] == pytest.approx(ideal, rel=0.05), (p, step[("1f1b", p)], ideal)
    assert step[("1f1b", 1)] == pytest.approx(summary["predicted"]["step_time_s"], rel=0.02)  # the run's own
    assert plan["inputs"]["p2p_s"] == pytest.approx(0.0002)
    assert "ran one rank, so it measured no hand-off between ranks" in stdout
    assert "hand each tensor over in 0.2 ms (--p2p-ms)" in stdout
    # (entries beside a run run at its p: no run of them beside it is offered for another p)
    assert "those at another p than the run's 1 only a run at that p measures" in stdout
    assert "a run of them beside it" not in stdout


def test_without_the_flag_the_hand_offs_are_free_and_the_plan_says_so(planned, tmp_path):
    _, plan, _ = planned
    run = plan["inputs"]["source"]
    r = ppx("plan", "--from-run", run, "--stages", "2", "--schedules", "1f1b", "--out", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    assert "hand each tensor over in 0 ms; give the link's latency with --p2p-ms" in r.stdout
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["inputs"]["p2p_s"] == 0.0


def test_a_run_of_several_ranks_keeps_its_measured_hand_offs(shared_run, tmp_path):
    run = shared_run(*PICTURED_1F1B).dir  # read only: shared with other files
    r = ppx("plan", "--from-run", str(run), "--p2p-ms", "0.1", "--out", str(tmp_path / "p"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"ppx: error: --from-run {run} measured its hand-offs between 2 ranks; leave out --p2p-ms"
    ]
    assert not (tmp_path / "p").exists()


def test_simulate_from_the_run_at_another_p_points_to_the_plan(planned):
    _, plan, _ = planned
    run = plan["inputs"]["source"]
    r = ppx("simulate", "1f1b", "-p", "2", "--from-run", run)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"ppx: error: {run} ran 1 rank with 1 stage each; its costs are per stage, so leave out --stages/--virtual "
        f"or give the same (ppx plan --from-run {run} --stages 2 regroups them)"
    ]
