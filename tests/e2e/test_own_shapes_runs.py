"""Your own model whose units hand on tensors of different shapes and dtypes, through `ppx run`
and `ppx plan --from-run` as a user runs them: each stage receives what the unit before it
hands on (tests/dist/test_own_models.py holds the gradients under every family), the memory
prediction holds, and a plan leaves out the stage counts whose split would begin a stage
with integers, its printed command running."""

from __future__ import annotations

import os

from helpers import REPO, ppx, read_json, run_args

# units [bins, embed, mix, pool]: bins hands on int64 (b, 16), embed and mix (b, 16, 8) floats
QUANTIZED = [
    "1f1b_2cpu",
    "model.kind=module",
    "model.module=helpers.own_shapes:quantized",
    "model.data=regression",
    "model.hidden=16",
]
# helpers/ importable by the runs (and this checkout's ppx first, where PYTHONPATH names it)
TESTS = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)}


def test_a_model_of_changing_shapes_runs_and_a_plan_keeps_its_stages_off_integers(tmp_path):
    run = tmp_path / "run"
    r = ppx(
        "run",
        *QUANTIZED,
        "pipeline.schedule=zb_h1",
        "train.split_backward=store",
        "train.steps=3",
        f"run.dir={run}",
        env=TESTS,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_json(run / "summary.json")
    assert s["status"] == "completed" and s["units_per_stage"] == [3, 1], s["units_per_stage"]
    assert abs(s["memory_prediction_error"]) <= 0.05, s["memory_prediction_error"]
    plan = ppx("plan", "--from-run", str(run), "--stages", "2,4", "--out", str(tmp_path / "plan"), env=TESTS)
    assert plan.returncode == 0, plan.stderr[-2000:]
    md = (tmp_path / "plan" / "plan.md").read_text()
    why = "4 stages would begin one after unit 0, which hands on integers or booleans (a stage receives floating point)"
    assert f"- 1f1b p=4 m=4 v=1: {why}: it cannot run" in md, md
    assert all(c["p"] * c["v"] != 4 for c in read_json(tmp_path / "plan" / "plan.json")["candidates"])
    args = run_args(plan.stdout)
    ran = ppx("run", *args, "train.steps=2", f"run.dir={tmp_path / 'best'}", env=TESTS)
    assert ran.returncode == 0, (args, ran.stderr[-2000:])


def test_a_v_of_graph_keeping_stages_predicts_its_peak_from_its_first_step_on(tmp_path):
    """A CNN cut by torch's tracer under ZB-V: its split backwards keep their graphs (nothing
    to store), and rank 1's second stage saves, as its input, the tensor its first stage saved
    as its output (a ReLU's): held once. Whether a stage changes its input in place is found
    before the first step (`ppx.engine.split_setup.settle_input_copies`); found by step 0's
    first forward, on a copy, that microbatch held it twice and the peak was 8 KiB (10%) under
    the prediction's."""
    run = tmp_path / "run"
    cnn = ["model.batch_fn=helpers.own_shapes:images", "model.loss_fn=helpers.own_shapes:classes"]
    keys = ["pipeline.schedule=zbv", "pipeline.microbatches=8", "train.batch_size=64", "pipeline.split=tracer"]
    r = ppx(
        "run",
        "1f1b_2cpu",
        "model.kind=module",
        "model.module=helpers.own_shapes:convnet",
        *cnn,
        *keys,
        "train.steps=2",
        f"run.dir={run}",
        env=TESTS,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_json(run / "summary.json")
    assert s["split_backward"]["1"]["mode"] == s["split_backward"]["2"]["mode"] == "graph", s["split_backward"]
    assert s["shared_with_stage_before"]["2"]["bytes"] > 0, s.get("shared_with_stage_before")
    for row in s["ranks"]:
        assert row["predicted_peak_activation_bytes"] == row["peak_activation_bytes"], row
