"""`ppx run` end to end: real torchrun, 4 gloo processes, complete run directories, and the
same losses for every schedule, every stage count and every repeat."""

from __future__ import annotations

import os

import pytest

from helpers import DATA, PICTURED_1F1B, REPO, ppx, read_json, read_jsonl

SMALL = ["model.hidden=32", "train.steps=3", "train.batch_size=16"]


def run(tmp_path, name, exp, *overrides):
    d = tmp_path / name
    r = ppx("run", exp, *SMALL, f"run.dir={d}", *overrides)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"ppx: run directory: {d}" in r.stdout
    return d, r


@pytest.fixture(scope="module")
def four_stage_runs(shared_run):
    """Read only: tests/e2e/test_multinode.py compares against the same gpipe_4gpu run."""
    out = {}
    for exp in ("gpipe_4gpu", "1f1b_4gpu"):
        s = shared_run(exp, *SMALL)
        assert f"ppx: run directory: {s.dir}" in s.result.stdout
        out[exp] = (s.dir, s.result)
    return out


@pytest.mark.parametrize("exp,schedule", [("gpipe_4gpu", "gpipe"), ("1f1b_4gpu", "1f1b")])
def test_four_stage_run_directory_is_complete(four_stage_runs, exp, schedule):
    d, r = four_stage_runs[exp]
    cfg = (d / "config.yaml").read_text()
    assert f"schedule: {schedule}" in cfg and "stages: 4" in cfg and "hidden: 32" in cfg
    env = read_json(d / "env.json")
    for key in ("python", "torch", "gloo", "nccl", "git", "hostnames", "ranks", "world_size", "seed", "command"):
        assert key in env, key
    assert env["world_size"] == 4 and len(env["ranks"]) == 4 and env["backend"] == "gloo"
    from ppx.launch.affinity import cpu_block, describe  # runtime.pin_cpus: each rank on its own block

    cpus = sorted(os.sched_getaffinity(0))
    assert [x["cpus"] for x in env["ranks"]] == [describe(cpu_block(r, 4, cpus)) for r in range(4)]
    assert set(env["git"]) == {"commit", "dirty"}
    assert env["command"].startswith(f"ppx run {exp}")
    lines = read_jsonl(d / "metrics.jsonl")
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert all(x["step_time_s"] > 0 and x["loss"] > 0 for x in lines)
    s = read_json(d / "summary.json")
    assert s["schedule"] == schedule and s["stages"] == 4 and s["microbatches"] == 8
    assert s["world_size"] == 4 and s["steps"] == 3 and s["status"] == "completed"
    assert (s["device"], s["backend"]) == ("cpu", "gloo")
    assert s["losses"] == [x["loss"] for x in lines]
    assert s["step_time_s"] == sorted(x["step_time_s"] for x in lines)[1]  # median of 3
    assert s["bubble_fraction_theory"] == pytest.approx(3 / 11)
    assert "running on CPU with gloo" in r.stderr  # auto fell back with a one-line notice
    assert r.stdout.count("step 0 (1/3)") == 1  # only rank 0 reports progress


def test_without_the_report_a_run_writes_its_json_files_only(four_stage_runs, shared_run):
    """logging.report=false (the tests' default, helpers.quiet): summary, metrics and
    timeline.json, no pictures and no page; with it on (the default), all three."""
    d, r = four_stage_runs["gpipe_4gpu"]
    assert "report: false" in (d / "config.yaml").read_text()
    assert all((d / f).stat().st_size > 0 for f in ("summary.json", "metrics.jsonl", "timeline.json"))
    assert not [f for f in ("report.html", "breakdown.png", "timeline.png") if (d / f).exists()]
    assert "ppx: report:" not in r.stdout
    pictured = shared_run(*PICTURED_1F1B)
    assert all((pictured.dir / f).stat().st_size > 0 for f in ("report.html", "breakdown.png", "timeline.png"))
    assert f"ppx: report: {pictured.dir / 'report.html'}" in pictured.result.stdout


def test_losses_equal_across_schedules_stage_counts_and_repeats(four_stage_runs, tmp_path):
    gpipe = read_json(four_stage_runs["gpipe_4gpu"][0] / "summary.json")["losses"]
    one_f_one_b = read_json(four_stage_runs["1f1b_4gpu"][0] / "summary.json")["losses"]
    single, _ = run(tmp_path, "single", "gpipe_4gpu", "pipeline.stages=1")
    ref = read_json(single / "summary.json")["losses"]
    assert gpipe == pytest.approx(ref, rel=1e-5)
    assert one_f_one_b == pytest.approx(ref, rel=1e-5)
    again, _ = run(tmp_path, "again", "gpipe_4gpu", "pipeline.stages=1")
    assert read_json(again / "summary.json")["losses"] == ref  # bit-identical on a repeat


CSV_1F1B = str(DATA / "1f1b_p2_m4.csv")  # `ppx schedule 1f1b -p 2 -m 4 --csv`
SAME_LOSSES = {
    "schedule from a CSV": ["pipeline.stages=2", "pipeline.microbatches=4", f"pipeline.schedule={CSV_1F1B}"],
    "torch's GPipe": ["pipeline.stages=2", "pipeline.schedule=torch_gpipe"],
    # started as their own processes, as on CUDA, not forked from torchrun
    "ranks started, not forked": ["runtime.fork_ranks=false"],
    "torch's interleaved 1F1B": ["pipeline.stages=2", "pipeline.schedule=torch_interleaved1f1b"],
    "two stages on one rank (local hand-offs)": [
        "pipeline.stages=1",
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.virtual_stages=2",
    ],
}


@pytest.mark.parametrize("case", list(SAME_LOSSES))
def test_more_ways_to_run_the_pipeline_give_the_same_losses(four_stage_runs, tmp_path, case):
    ref = read_json(four_stage_runs["gpipe_4gpu"][0] / "summary.json")["losses"]
    d, _ = run(tmp_path, "run", "gpipe_4gpu", *SAME_LOSSES[case])
    assert read_json(d / "summary.json")["losses"] == pytest.approx(ref, rel=1e-5)


def test_forward_only_gives_the_losses_of_training_at_lr_0(tmp_path):
    """No backward, no update: each step's batch through the first weights, as training with
    a learning rate of 0 (one process) sees it."""
    d, _ = run(tmp_path, "fwd", "gpipe_4gpu", "pipeline.schedule=forward_only")
    still, _ = run(tmp_path, "still", "gpipe_4gpu", "pipeline.stages=1", "train.lr=0")
    s = read_json(d / "summary.json")
    assert s["losses"] == pytest.approx(read_json(still / "summary.json")["losses"], rel=1e-5)
    assert len(set(s["losses"])) == len(s["losses"])  # a new batch each step
    assert all(r["peak_inflight_microbatches"] == 0 for r in s["ranks"])  # nothing held for a backward


def test_adamw_gives_the_same_losses_on_any_stage_count(four_stage_runs, tmp_path):
    sgd = read_json(four_stage_runs["gpipe_4gpu"][0] / "summary.json")["losses"]
    four, _ = run(tmp_path, "four", "gpipe_4gpu", "train.optimizer=adamw")
    one, _ = run(tmp_path, "one", "gpipe_4gpu", "train.optimizer=adamw", "pipeline.stages=1")
    a, b = (read_json(x / "summary.json")["losses"] for x in (four, one))
    assert a == pytest.approx(b, rel=1e-5)
    assert a[0] == pytest.approx(sgd[0], rel=1e-6) and a[1:] != pytest.approx(sgd[1:], rel=1e-3)


def test_two_stage_transformer_repeats_exactly_and_learns(tmp_path):
    a, _ = run(tmp_path, "a", "transformer_1f1b_2cpu", "train.steps=6")
    b, _ = run(tmp_path, "b", "transformer_1f1b_2cpu", "train.steps=6")
    la, lb = read_json(a / "summary.json")["losses"], read_json(b / "summary.json")["losses"]
    assert la == lb
    assert la[-1] < la[0]


def test_default_run_directory_lives_under_runs_root(shared_run):
    s = shared_run(*PICTURED_1F1B)  # no run.dir: <run.root>/<experiment>/<timestamp>
    (d,) = (s.root / "1f1b_2cpu").iterdir()
    assert f"ppx: run directory: {d}" in s.result.stdout
    assert (d / "summary.json").exists()


def test_a_split_backward_way_under_a_schedule_without_one_is_noted(tmp_path):
    """train.split_backward=store under 1F1B (say an experiment's setting, swept across
    schedules) changes nothing: the run says so in one line and runs, with nothing split."""
    d, r = run(tmp_path, "store", "1f1b_2cpu", "train.split_backward=store", "train.steps=1")
    note = "ppx: note: train.split_backward=store changes nothing here: 1f1b splits no backward into I and W"
    assert note in r.stderr.splitlines()
    assert read_json(d / "summary.json").get("split_backward") is None
    _, zb = run(tmp_path, "zb", "1f1b_2cpu", "pipeline.schedule=zb_h1", "train.split_backward=store", "train.steps=1")
    assert "changes nothing" not in zb.stderr


def test_recomputation_under_a_list_without_backward_is_noted(tmp_path):
    """train.recompute under forward_only changes nothing (no backward re-runs a forward): the
    run says so in one line, naming the modes as given, and runs."""
    d, r = run(
        tmp_path, "fo", "1f1b_2cpu", "pipeline.schedule=forward_only", "train.recompute=[none,full]", "train.steps=1"
    )
    note = (
        "ppx: note: train.recompute=[none, full] changes nothing here: forward_only runs no backward, "
        "where recomputation re-runs a forward"
    )
    assert note in r.stderr.splitlines()
    assert read_json(d / "summary.json")["status"] == "completed"


def test_a_run_started_with_its_output_closed_completes(tmp_path):
    """``ppx run <&- >&- 2>&-``: Python makes sys.stdout (stderr) None, whose flush failed every
    rank once the run was written, exit 1 and incomplete.txt; the job's processes found the
    descriptor closed too. (One closed alone: tests/unit/test_closed_stdout.py.)"""
    import subprocess
    import sys

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "ppx.cli", "run", "gpipe_2cpu", *SMALL, "train.steps=2", f"run.dir={run}"]
    r = subprocess.run(cmd, cwd=REPO, preexec_fn=lambda: [os.close(fd) for fd in (0, 1, 2)], timeout=240)
    assert r.returncode == 0 and (run / "summary.json").exists() and not (run / "incomplete.txt").exists()


def test_a_run_whose_output_pipe_closes_goes_on_to_complete(tmp_path):
    """``ppx run ... | head -1``: rank 0's later progress lines meet a closed pipe; the run
    goes on to complete (it failed as rank 0's BrokenPipeError, incomplete), exit 0."""
    import subprocess
    import sys

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "ppx.cli", "run", "gpipe_2cpu", "train.steps=12", f"run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the first progress line, then the reader goes away
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=240) == 0, err[-3000:]
    assert first.startswith("[gpipe_2cpu] step 0 (1/12)"), first
    assert (run / "summary.json").exists() and not (run / "incomplete.txt").exists(), err[-3000:]
    assert len(read_jsonl(run / "metrics.jsonl")) == 12


def test_a_run_whose_reader_is_gone_before_its_first_line_completes(tmp_path):
    """``ppx run gpipe_4gpu 2>&1 | head -n 0``: the launcher's first line (the CPU fallback's
    notice, to stderr) meets a pipe no one reads; the run completes, exit 0 (it ended with 141
    before the job started, no run made)."""
    import subprocess
    import sys

    run = tmp_path / "run"
    read, write = os.pipe()
    os.close(read)  # (the reader gone before the run's first write)
    cmd = [sys.executable, "-m", "ppx.cli", "run", "gpipe_4gpu", *SMALL, "train.steps=2", f"run.dir={run}"]
    try:
        r = subprocess.run(cmd, cwd=REPO, stdout=write, stderr=write, timeout=240)
    finally:
        os.close(write)
    assert r.returncode == 0 and (run / "summary.json").exists() and not (run / "incomplete.txt").exists()


def test_a_sweep_whose_output_pipe_closes_runs_every_point(tmp_path):
    """``ppx sweep ... | head -1``: the sweep's later lines meet a closed pipe; every point runs
    and the comparison is written, exit 0 (it ended with SIGPIPE's 141 after the point running)."""
    import subprocess
    import sys

    sweep = ["--sweep", "pipeline.schedule=gpipe,1f1b", "model.hidden=16", "train.steps=1", f"run.root={tmp_path}"]
    cmd = [sys.executable, "-m", "ppx.cli", "sweep", "1f1b_2cpu", *sweep, "logging.wandb.mode=disabled"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the sweep's first line, then the reader goes away
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=240) == 0, err[-3000:]
    assert first.startswith("ppx sweep: 2 runs into "), first
    (root,) = (tmp_path / "1f1b_2cpu").glob("sweep-*")
    assert all((root / p / "summary.json").exists() for p in ("schedule=gpipe", "schedule=1f1b")), err[-3000:]
    assert (root / "compare.md").exists()
