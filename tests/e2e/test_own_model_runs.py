"""Your own model through `ppx run` and `ppx plan` as a user runs them (issue "Your own model"):
a shipped Hugging Face experiment (GPT-2: Conv1D layers, learned positions, a tied head) and
the example module (examples/tiny_gpt.py) under ZB-H1, each stage storing its layers for W,
the memory prediction within 5 %; `ppx plan --from-run` of each, whose printed command runs;
and a machine without transformers told in one line how to install it."""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO, ppx, read_json, run_args

pytest.importorskip("transformers")

RUNS = {
    "hf_gpt2": ["hf_gpt2_tiny_gpipe_2cpu", "model.layers=2", "model.seq_len=16"],
    "module": ["examples/tiny_gpt.yaml"],
}
SHORT = ["pipeline.schedule=zb_h1", "train.split_backward=store", "train.steps=3"]  # stores on the first stage too


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    out = {}
    for name, args in RUNS.items():
        r = ppx("run", *args, *SHORT, f"run.dir={root / name}")
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_of_your_own_model_stores_its_layers_and_predicts_its_memory(runs, name):
    s = read_json(runs[name] / "summary.json")
    assert s["status"] == "completed" and len(s["losses"]) == 3
    assert s["memory_prediction_error"] is not None and abs(s["memory_prediction_error"]) <= 0.05
    # every stage's Linear (GPT-2's Conv1D) layers are stored for W, none walks the graph again
    assert {k: v["mode"] for k, v in s["split_backward"].items()} == {"0": "store", "1": "store"}
    assert all(v["stored_layers"] >= 2 for v in s["split_backward"].values())


@pytest.mark.parametrize("name", list(RUNS))
def test_a_plan_from_the_run_prints_a_command_that_runs(runs, name, tmp_path):
    plan = ppx("plan", "--from-run", str(runs[name]), "--out", str(tmp_path / "plan"))
    assert plan.returncode == 0, plan.stderr[-2000:]
    args = run_args(plan.stdout)
    r = ppx("run", *args, "train.steps=2", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 0, (args, r.stderr[-2000:])
    assert read_json(tmp_path / "run" / "summary.json")["schedule"] == str(tmp_path / "plan" / "best.csv")
    # cut in 4 stages, GPT-2's stage 0 is its embedding alone: nothing to store, it keeps its
    # graph (store refused it at build, and the plan's ZB-V command failed); candidates that
    # split no backward are told auto (store would change nothing there)
    candidates = read_json(tmp_path / "plan" / "plan.json")["candidates"]
    cut = [c for c in candidates if c["v"] == 2 and c["schedule"] == "zbv"]
    assert cut and "train.split_backward" not in cut[0]["command"]
    assert all("train.split_backward=auto" in c["command"] for c in candidates if c["schedule"] == "1f1b")
    if name != "hf_gpt2":
        return
    args = run_args(cut[0]["command"])
    r = ppx("run", *args, "train.steps=2", f"run.dir={tmp_path / 'zbv'}")
    assert r.returncode == 0, (cut[0]["command"], r.stderr[-2000:])


def test_a_plan_from_your_modules_run_plans_where_the_module_does_not_import(runs, tmp_path):
    """From a folder where examples.tiny_gpt does not import, the plan still prices the run: its
    stages' units read from summary.json (the split it ran), its candidates split evenly."""
    plan = ppx("plan", "--from-run", str(runs["module"]), "--out", str(tmp_path / "plan"), cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr[-2000:]
    ran = read_json(runs["module"] / "summary.json")["units_per_stage"]
    assert read_json(tmp_path / "plan" / "plan.json")["inputs"]["run_units"] == ran


@pytest.mark.plain_agent  # (its stand-in for transformers: a new process, which the command server would not serve)
def test_without_transformers_one_line_says_how_to_install_it(tmp_path):
    fake = tmp_path / "transformers"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named transformers')\n")
    r = ppx("run", "hf_llama_tiny_1f1b_2cpu", f"run.root={tmp_path / 'runs'}", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "ppx: error: model.kind=hf needs Hugging Face transformers: make setup in the checkout (or pip install -e "
        "'.[hf]' there, or pip install transformers)"
    ]
    assert not (tmp_path / "runs").exists()


def test_a_stage_of_parameter_free_units_trains_as_one_process_does(tmp_path):
    """A last stage of an activation alone (helpers/own_module.py's Linear, a scaling, Linear, Tanh
    cut [3, 1]): its rank builds an optimizer of no parameter and runs its backward whole (no W
    to defer); it failed after the ranks started ("optimizer got an empty parameter list"), and
    a plan printed such a command. Its losses are the unsplit model's, step after step."""
    own = ["1f1b_2cpu", "model.kind=module", "model.module=helpers.own_module:parameter_free_last"]
    own += ["model.data=regression", "model.hidden=16", "model.layers=4", "train.steps=3"]
    tests = {"PYTHONPATH": str(REPO / "tests")}
    r = ppx(
        "run",
        *own,
        "pipeline.schedule=zb_h1",
        "pipeline.layers_per_stage=[3,1]",
        f"run.dir={tmp_path / 'p2'}",
        env=tests,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_json(tmp_path / "p2" / "summary.json")
    assert s["split_backward"]["1"] == {
        "mode": "whole",
        "why": "it holds no parameter, so no W: one backward, in the I",
        "no_parameters": True,
    }
    assert "stage 1 whole (it holds no parameter, so no W: one backward, in the I)" in r.stdout
    # its buffer, which every microbatch's forward saves, is the stage's state, not a microbatch's
    # activation (counted once measured and once a microbatch predicted: +7.7% on such a model)
    assert s["memory_prediction_error"] == 0, s["memory_prediction_error"]
    one = ppx("run", *own, "pipeline.stages=1", f"run.dir={tmp_path / 'p1'}", env=tests)
    assert one.returncode == 0, one.stderr[-3000:]
    assert s["losses"] == read_json(tmp_path / "p1" / "summary.json")["losses"]


def test_a_weight_read_outside_its_layer_is_not_stored_by_store(tmp_path):
    """train.split_backward=store on a tied autoencoder (its Linear's weight read again,
    transposed, by F.linear): W alone would drop that read's gradient (the run trained on,
    silently wrong); one line before the first step (auto keeps the graph there:
    tests/dist/test_own_models.py holds its gradients)."""
    own = ["1f1b_2cpu", "model.kind=module", "model.module=helpers.own_module:tied_outside", "model.data=regression"]
    own += ["model.hidden=16", "model.args={width: 16}", "pipeline.schedule=zb_h1", "train.split_backward=store"]
    r = ppx("run", *own, "train.steps=2", f"run.dir={tmp_path / 'run'}", env={"PYTHONPATH": str(REPO / "tests")})
    line = (
        r"ppx: error: train.split_backward=store: layer [12]\.enc: its weight is also used outside its own call "
        r"\(tied, or F\.linear on it\), so W alone would miss that use's gradient; use train.split_backward=auto"
    )  # (either rank's layer: the first to say it)
    assert r.returncode == 1 and re.fullmatch(line, r.stderr.splitlines()[0]), r.stderr[-3000:]
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""  # (no step ran)


def test_a_batch_whose_shapes_change_from_step_to_step_ends_the_run_in_one_line(tmp_path):
    """A batch function whose batch shrinks at step 1 (a dataset's short last batch): the rank
    that made it says so in one line, and no step after runs (it ran on a partly stale buffer,
    or ended the job in gloo's abort where the batch grew)."""
    own = ["1f1b_2cpu", "model.kind=module", "model.module=helpers.own_module:build", "model.data=regression"]
    own += ["model.hidden=16", "model.args={width: 16}", "model.batch_fn=helpers.own_batches:batch_shrinking"]
    r = ppx("run", *own, "train.steps=3", f"run.dir={tmp_path / 'run'}", env={"PYTHONPATH": str(REPO / "tests")})
    line = (
        r"ppx: error: model\.batch_fn=helpers\.own_batches:batch_shrinking on rank [01]: step 1's inputs and targets "
        r"are \(16, 16\) float32 and \(16, 16\) float32, where step 0's were \(32, 16\) float32 and \(32, 16\) "
        r"float32; ppx builds its stages for the first step's batch \(the microbatches, what they send\): keep a "
        r"batch's shapes and dtypes fixed \(pad to one length\)"
    )  # (rank 0 makes the inputs, rank 1 the targets: the first to say it)
    assert r.returncode == 1 and re.fullmatch(line, r.stderr.splitlines()[0]), r.stderr[-3000:]
    steps = {json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()}
    assert steps <= {0}


def test_an_error_in_your_models_code_is_named_where_it_raised_with_its_traceback_kept(tmp_path):
    """A unit of the user's that raises in a step (helpers/own_module.py's, on its third call:
    stage 1's third forward): the one line says where in their code, and the rank's whole
    traceback is kept in the run's status folder, named by the line (it said only
    ``ValueError: my model broke here``, nowhere a file or a line)."""
    own = ["1f1b_2cpu", "model.kind=module", "model.module=helpers.own_module:breaks_in_a_run"]
    own += ["model.data=regression", "model.hidden=16", "model.layers=4", "train.steps=2"]
    r = ppx("run", *own, f"run.dir={tmp_path / 'run'}", env={"PYTHONPATH": str(REPO / "tests")})
    assert r.returncode == 1, r.stderr[-3000:]
    source = (REPO / "tests" / "helpers" / "own_module.py").read_text().splitlines()
    line = source.index('            raise ValueError("my model broke here")') + 1
    kept = tmp_path / "run" / "status" / "rank1.traceback"
    said = (
        f"rank 1 failed at step 0 on 1F2: ValueError: my model broke here (at tests/helpers/own_module.py:{line}) "
        f"(its traceback: {kept})"
    )
    assert f"ppx: error: {said}\n" in r.stderr, r.stderr[-3000:]
    assert (tmp_path / "run" / "incomplete.txt").read_text().splitlines()[0] == said
    trace = kept.read_text()
    assert trace.startswith("Traceback (most recent call last):\n")
    assert f'own_module.py", line {line}, in forward\n' in trace and trace.endswith("ValueError: my model broke here\n")
    assert "Traceback" not in r.stderr  # (on the terminal: the one line)
