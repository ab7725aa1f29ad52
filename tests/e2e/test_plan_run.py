"""`ppx plan` confirmed by a run: plan on the known-cost model's costs at p=2, run the printed
best.csv with the printed overrides, and hold the measured step against the prediction; then
plan again from that run's directory, whose measured costs predict its step closer still."""

from __future__ import annotations

import json
import re

import pytest

from helpers import ppx, read_json
from ppx.schedules.csv_io import read_csv

F, B, W = 50, 50, 25  # ms per microbatch per stage: forward, input-gradient, weight-gradient
SCHEDULES = "1f1b,zb_h1,interleaved_1f1b,zbv,zb_auto"
COSTS = ["--fwd-ms", str(F), "--bwd-ms", str(B), "--wgrad-ms", str(W), "--stages", "2", "--microbatches", "4"]
RUN = ["model.hidden=16", "train.steps=4"]


def printed_command(stdout: str) -> tuple[list[str], list[str]]:
    """The printed `ppx run` command's pipeline overrides and the rest (a flags plan's: the
    known-cost model at the planned costs)."""
    run = next(line for line in stdout.splitlines() if line.startswith("ppx run "))
    words = run.split()[3:]
    return [w for w in words if w.startswith("pipeline.")], [w for w in words if not w.startswith("pipeline.")]


# every test that reads these runs is marked timing (the fixture runs in its first
# requester's set-up): a plan's predicted step against the run's measured one
@pytest.fixture(scope="module")
def planned_and_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    r = ppx("plan", *COSTS, "--schedules", SCHEDULES, "--virtual", "2", "--out", str(root / "plan"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split()[:2] == ["rank", "schedule"]
    pipeline, model = printed_command(r.stdout)
    assert pipeline[0] == f"pipeline.schedule={root / 'plan' / 'best.csv'}" and model[0] == "model.kind=synthetic"
    run = ppx("run", "1f1b_2cpu", *pipeline, *model, *RUN, f"run.dir={root / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    return root, read_json(root / "plan" / "plan.json"), read_json(root / "run" / "summary.json")


@pytest.mark.timing
def test_the_best_plan_runs_with_its_schedule(planned_and_run):
    root, plan, summary = planned_and_run
    best = plan["best"]
    assert summary["schedule"] == str(root / "plan" / "best.csv")
    assert (summary["world_size"], summary["stages"], summary["microbatches"]) == (2, 2 * best["v"], best["m"])
    assert summary["status"] == "completed" and len(summary["losses"]) == 4


@pytest.mark.timing
def test_the_measured_step_is_near_the_prediction(planned_and_run):
    # the flags hold no hand-off or overhead cost: the run pays ~1 ms an action beyond them;
    # figures on a shared 2-core machine
    _, plan, summary = planned_and_run
    predicted, measured = plan["best"]["step_s"], summary["step_time_s"]
    assert measured == pytest.approx(predicted, rel=0.10), (measured, predicted)


@pytest.mark.timing
def test_a_plan_from_the_run_predicts_its_step(planned_and_run):
    root, plan, summary = planned_and_run
    best = plan["best"]
    r = ppx("plan", "--from-run", str(root / "run"), "--out", str(root / "plan2"))
    assert r.returncode == 0, r.stderr
    again = json.loads((root / "plan2" / "plan.json").read_text())
    assert again["inputs"]["source"] == str(root / "run") and again["inputs"]["transport"] == "gloo"
    assert {c["p"] for c in again["candidates"]} == {2}
    same = next(c for c in again["candidates"] if (c["schedule"], c["m"], c["v"]) == (best["schedule"], 4, best["v"]))
    # measured costs carry the run's hand-offs and overheads: closer than the flags' prediction
    assert same["step_s"] == pytest.approx(summary["measured_step_time_s"], rel=0.05)
    assert "samples/s" in r.stdout and "run.dir=null" in r.stdout
    assert f"ppx run {root / 'run' / 'config.yaml'} pipeline.schedule=" in r.stdout


def test_an_interleaved_best_csv_runs_with_its_stage_map(tmp_path):
    r = ppx("plan", *COSTS, "--schedules", "interleaved_1f1b", "--virtual", "2", "--out", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr
    pipeline, model = printed_command(r.stdout)
    assert "pipeline.virtual_stages=2" in pipeline
    run = ppx("run", "1f1b_2cpu", *pipeline, *model, "model.hidden=16", "train.steps=2", f"run.dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    s = read_json(tmp_path / "run" / "summary.json")
    assert (s["status"], s["stages"], s["virtual_stages"]) == ("completed", 4, 2)
    # every compute ran on the rank best.csv places its stage on: stage s on rank s % p
    ran = {
        (int(re.match(r"\d+", e["name"]).group()), e["args"]["rank"])
        for e in read_json(tmp_path / "run" / "timeline.json")["traceEvents"]
        if e.get("cat") == "compute"
    }
    assert ran == {(stage, stage % 2) for stage in range(4)}
    assert ran == set(enumerate(read_csv(tmp_path / "plan" / "best.csv").stage_to_rank))


def test_calibrate_measures_this_machine_once_and_later_plans_take_it(tmp_path):
    env = {"PPX_CACHE_DIR": str(tmp_path / "cache")}
    plan = ["plan", *COSTS, "--schedules", "1f1b,zb_h1"]
    r = ppx(*plan, "--calibrate", "--out", str(tmp_path / "first"), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted((tmp_path / "cache" / "calibration").glob("*/p2/*/summary.json"))
    assert len(runs) == 1 and read_json(runs[0])["status"] == "completed"
    assert "ppx plan: calibrating this machine: ppx run 1f1b_2cpu model.kind=synthetic pipeline.stages=2" in r.stdout
    assert f"runtime figures from this machine's calibration {runs[0].parent}, measured now" in r.stdout
    first = read_json(tmp_path / "first" / "plan.json")["inputs"]
    # this machine's figures, not the flags' zeros; the calibration ran gloo on CPU
    assert first["overhead_s"] > 0 and first["p2p_s"] > 0 and first["transport"] == "gloo"
    again = ppx(*plan, "--calibrate", "--out", str(tmp_path / "again"), env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "calibrating" not in again.stdout and f"{runs[0].parent}, measured 20" in again.stdout
    kept = read_json(tmp_path / "again" / "plan.json")["inputs"]
    assert (kept["overhead_s"], kept["p2p_s"]) == (first["overhead_s"], first["p2p_s"])
    # later plans from flags alone take the kept calibration too, and say so; given figures win
    plain = ppx(*plan, "--out", str(tmp_path / "plain"), env=env)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert f"{runs[0].parent}, measured 20" in plain.stdout and "kept by an earlier --calibrate" in plain.stdout
    assert read_json(tmp_path / "plain" / "plan.json")["inputs"]["overhead_s"] == first["overhead_s"]
    ideal = ppx(*plan, "--overhead-ms", "0", "--p2p-ms", "0", "--out", str(tmp_path / "ideal"), env=env)
    assert "note: assumed 0 ms of runtime overhead per action and 0 ms per hand-off (flags)" in ideal.stdout
    other = ppx(*plan, "--transport", "nccl", "--out", str(tmp_path / "nccl"), env=env)  # another machine's plan
    assert "note: assumed 0 ms of runtime overhead per action and 0 ms per hand-off (flags)" in other.stdout
    named = ppx(*plan, "--machine-from", str(runs[0].parent), "--out", str(tmp_path / "named"), env=env)
    assert named.returncode == 0, named.stderr[-3000:]
    got = read_json(tmp_path / "named" / "plan.json")["inputs"]
    assert (got["overhead_s"], got["p2p_s"], got["transport"]) == (first["overhead_s"], first["p2p_s"], "gloo")
    assert len(list((tmp_path / "cache").rglob("summary.json"))) == 1


def test_a_calibration_that_fails_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    r = ppx(
        "plan", *COSTS, "--calibrate", "--out", str(tmp_path / "plan"), env={"PPX_CACHE_DIR": str(tmp_path / "file")}
    )
    assert r.returncode == 2
    err = r.stderr.strip()
    assert err.startswith("ppx: error: --calibrate: the calibration run failed: ") and "\n" not in err, err
    assert "ppx: error: ppx: error:" not in err and not (tmp_path / "plan").exists()


def test_a_plan_of_the_runs_own_config_predicts_the_runs_own_step(shared_run, tmp_path):
    """The run's report and `ppx plan --from-run` draw the expected step alike (32 draws, each
    seeded apart, from the rounded samples summary.json keeps, stalls left out): the run's own
    config gets the run's own prediction (a 1F1B run predicted 3.39 ms, its plan 3.25 ms)."""
    from helpers.run import PICTURED_1F1B

    run = shared_run(*PICTURED_1F1B).dir  # read only: shared with other files
    summary = read_json(run / "summary.json")
    r = ppx("plan", "--from-run", str(run), "--schedules", "1f1b", "--out", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr
    own = next(
        c for c in read_json(tmp_path / "plan" / "plan.json")["candidates"] if (c["p"], c["m"], c["v"]) == (2, 4, 1)
    )
    pred = summary["predicted"]
    assert (own["step_s"], own["bubble"]) == pytest.approx((pred["step_time_s"], pred["bubble_fraction"]), rel=1e-9)
