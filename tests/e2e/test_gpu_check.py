"""`ppx gpu-check` as a user runs it: without CUDA, one line and nothing written; under the
test switch (--on-cpu) the whole machinery on CPU with gloo (real runs, the folder, the
report, the docs block, the CUDA-only rows skipped); each check's arithmetic on the files
those runs recorded, with a failing variant of each; bad input; and, on a machine with GPUs,
the checks that need them."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import CUDA_DEVICES, GPU_ENV, ppx, read_json
from ppx.commands.gpu_check import NO_GPU
from ppx.gpucheck import memory, nccl, overlap, precision, profiler, saved, sizes, timers
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.report import BEGIN, END
from ppx.gpucheck.runs import Runner, Runs, RunSpec
from ppx.gpucheck.traces import load, profiler_traces, timeline_slices
from ppx.report.run_dir import RunDir

NOTHING = f"ppx: error: {NO_GPU}\n"


# every test that reads these runs is marked timing (the fixture runs in its first
# requester's set-up): the timers', profiler's and bubble checks' thresholds, 1-3%
@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    """One `ppx gpu-check --on-cpu` (about 40 s on 2 cores): (its folder, the docs file, the process)."""
    base = tmp_path_factory.mktemp("gpucheck")
    doc = base / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\n{BEGIN}\nnone has run yet\n{END}\n\nmore\n")
    r = ppx("gpu-check", "--on-cpu", "--out", str(base / "check"), "--docs", str(doc), timeout=400, cwd=base)
    return base / "check", doc, r


def test_without_cuda_it_fails_in_one_line_and_writes_nothing(tmp_path):
    r = ppx("gpu-check", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", NOTHING)
    assert list(tmp_path.iterdir()) == []
    code = (
        "import sys; from ppx.cli import main; rc = main(['gpu-check']); assert 'torch' not in sys.modules, 'torch imported'; "
        "sys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (2, NOTHING), r.stdout  # the answer takes no torch (1.5 s) to give


@pytest.mark.timing
def test_the_whole_check_on_cpu(cpu_check):
    out, doc, r = cpu_check
    data = json.loads((out / "gpu-check.json").read_text())
    rows = {(c["check"], row["what"]): row for c in data["checks"] for row in c["rows"]}
    assert r.returncode == (1 if data["verdicts"]["FAIL"] else 0), r.stdout[-3000:]
    verdicts = {c["check"]: c["verdict"] for c in data["checks"]}
    assert verdicts["memory"] == verdicts["overlap"] == verdicts["nccl"] == "SKIPPED"
    assert verdicts["timers"] == verdicts["saved"] == verdicts["bf16"] == verdicts["profiler"] == "PASS", r.stdout
    assert verdicts["throughput"] in ("PASS", "FAIL")  # ppx against torch: judged, whichever way it came out
    split = next(c for c in data["checks"] if c["check"] == "split")  # read from throughput's 1F1B and ZB-H1 runs
    costs = [
        read_json(out / "runs" / f"throughput-{n}" / "summary.json")["measured_costs"]["action_s"]
        for n in ("zb_h1", "1f1b")
    ]
    assert split["data"]["iw_over_b"] == [(costs[0]["0I"] + costs[0]["0W"]) / costs[1]["0B"]]
    assert [row["verdict"] for row in split["rows"]][1] == "SKIPPED" and "one rank" in split["rows"][1]["figure"]
    assert sorted(run["name"] for run in split["runs"]) == ["throughput-1f1b", "throughput-zb_h1"]
    kernels = rows[("profiler", profiler.CRITERIA[0][0])]
    assert kernels["verdict"] == "SKIPPED" and kernels["figure"] == "skipped: needs CUDA: a CPU trace has no kernels"
    assert all(row["threshold"] and row["figure"] for row in rows.values())
    assert data["machine"]["torch"] and data["machine"]["load_1_5_15"]
    for c in data["checks"]:
        for run in c["runs"]:
            assert run["ok"] and (out / run["run_dir"] / "summary.json").exists() and (out / run["log"]).exists()
            assert run["command"].startswith(f"ppx run configs/{run['name']}.yaml run.dir=runs/")
    md = (out / "gpu-check.md").read_text()
    assert "| check | what | figure | threshold | verdict |" in md and "## timers: Timers on the known-cost model" in md
    assert f"ppx gpu-check: {data['verdicts']['PASS']} PASS" in r.stdout and str(out / "gpu-check.md") in r.stdout
    text = doc.read_text()
    assert "none has run yet" not in text and text.endswith(f"{END}\n\nmore\n")
    assert f"- {data['date']}: timers, " in text and "| timers | each action's timed length" in text
    assert f"| **PASS** | {data['date']} |" in text


@pytest.mark.timing
def test_timers_arithmetic_on_the_recorded_run(cpu_check):
    run = RunDir(cpu_check[0] / "runs" / "timers-1f1b")
    costs = timers.set_costs(run.config, run.raw_summary["stages"])
    assert costs == {"0F": 0.010, "0B": 0.020, "0I": 0.020, "0W": 0.0}
    samples = run.raw_summary["cost_samples"]["action_s"]
    assert timers.judge_actions(timers.action_ratios(samples, costs))[1] is True
    wrong = {k: v * 1.1 for k, v in costs.items()}  # the actions against costs they were not set
    assert timers.judge_actions(timers.action_ratios(samples, wrong))[1] is False
    slices = timeline_slices(load(run.path / "timeline.json"))
    assert timers.judge_steps(timers.step_ratios(slices, run.metrics))[1] is True
    late = [{**m, "ranks": [{**r, "step_s": r["step_s"] * 1.05} for r in m["ranks"]]} for m in run.metrics]
    assert timers.judge_steps(timers.step_ratios(slices, late))[1] is False


@pytest.mark.timing
def test_profiler_arithmetic_on_the_recorded_trace(cpu_check):
    run = RunDir(cpu_check[0] / "runs" / "profiler")
    (trace,) = profiler_traces(run.path).values()
    events = load(trace)["traceEvents"]
    assert profiler.judge_steps({0: profiler.step_errors(events, run.metrics, 0)})[1] is True
    short = [{**m, "ranks": [{**r, "step_s": r["step_s"] * 0.9} for r in m["ranks"]]} for m in run.metrics]
    assert profiler.judge_steps({0: profiler.step_errors(events, short, 0)})[1] is False
    held, total, _ = profiler.kernels_under_labels(events)
    assert (held, total) == (0, 2 * 2 * 4 * 2)  # 2 stages x F and B x 4 microbatches x 2 recorded steps, no kernel
    assert profiler.judge_kernels({0: (held, total, [])})[1] is False


@pytest.mark.timing
def test_saved_and_bf16_arithmetic_on_the_recorded_runs(cpu_check):
    summary = RunDir(cpu_check[0] / "runs" / "saved-zbv").raw_summary
    errors = saved.saved_errors(summary)
    assert errors and saved.judge_saved({"zbv": errors})[1] is True
    off = {
        **summary,
        "ranks": [{**r, "predicted_peak_activation_bytes": r["peak_activation_bytes"] * 0.9} for r in summary["ranks"]],
    }
    assert saved.judge_saved({"zbv": saved.saved_errors(off)})[1] is False
    losses = {
        n: RunDir(cpu_check[0] / "runs" / f"bf16-{n}").raw_summary["losses"]
        for n in ("fp32-p1", "fp32-split", "bf16-p1")
    }
    assert precision.judge_gap(precision.loss_gap(losses["fp32-split"], losses["fp32-p1"]), 0.0)[1] is True
    assert precision.judge_gap(precision.loss_gap(losses["bf16-p1"], losses["fp32-p1"]), 0.0)[1] is False
    summaries = {
        n: RunDir(cpu_check[0] / "runs" / n).raw_summary for n in ("bf16-bf16-p1", "bf16-fp32-p1", "bf16-tf-bf16")
    }
    half = precision.saved_ratio(summaries["bf16-bf16-p1"], summaries["bf16-fp32-p1"])
    assert precision.judge_half({"llama-tiny": half})[1] is True
    same = precision.saved_ratio(summaries["bf16-fp32-p1"], summaries["bf16-fp32-p1"])  # fp32 against itself: 1.0
    assert same == 1.0 and precision.judge_half({"llama-tiny": half, "fp32": same})[1] is False
    assert (
        precision.saved_ratio(
            {**summaries["bf16-tf-bf16"], "saved_bytes_per_microbatch": None}, summaries["bf16-fp32-p1"]
        )
        == math.inf
    )


@pytest.mark.timing
def test_overlap_on_cpu_runs_of_its_own_shape(tmp_path):
    """DualPipeV's cells on CPU run one part after the other: the known-cost cells come out
    near F + B, not max(F, B), and the check fails; the run of the same order from the CSV
    without cells computes the same losses as the run with them."""
    runner = Runner(tmp_path, Machine("cpu", 0, small=True), time.monotonic() + 300)
    tiny = {**sizes.transformer(32, 4, 2, 16, 64, batch=2 * overlap.M, steps=3)}
    specs = [
        RunSpec.of("overlap-kc", sizes.known_cost("dualpipev", 1, overlap.M, 5.0, 5.0, 5.0, steps=3, v=2), 60),
        RunSpec.of("overlap-cells", {**tiny, **sizes.pipeline("dualpipev", 1, overlap.M, 2)}, 60),
        RunSpec.of("overlap-apart", {**tiny, **sizes.pipeline("csv", 1, overlap.M)}, 60, csv=overlap.apart_csv()),
    ]
    for spec in specs:
        assert runner.run(spec).dir is not None, (tmp_path / "runs" / f"{spec.name}.log").read_text()[-2000:]
    out = overlap.judge(Machine("cuda", 1), Runs(runner))
    known, real = out.rows
    assert known.verdict == "FAIL" and 0.95 < known.value < 1.1, known
    # the real model's ratio is CPU timing on a shared machine: measured, not held here
    assert real.value > 0 and len(out.details) == 2 + len(overlap.cells())
    cells, apart = (RunDir(tmp_path / "runs" / n) for n in ("overlap-cells", "overlap-apart"))
    assert apart.config.pipeline.schedule.endswith("configs/overlap-apart.csv")
    assert apart.raw_summary["losses"] == cells.raw_summary["losses"]


@pytest.mark.timing
def test_the_cuda_judges_read_real_run_files(cpu_check):
    """The memory and NCCL judges on CPU runs standing in for their GPU runs: they read every
    field they need, and say FAIL (a resident set is no allocated peak; gloo is not NCCL)."""
    runs = cpu_check[0] / "runs"
    stand_in = {
        "memory-transformer": RunDir(runs / "saved-zbv"),
        "memory-llama-tiny": RunDir(runs / "bf16-fp32-p1"),
        "nccl-1f1b-cuda": RunDir(runs / "bf16-fp32-split"),
        "nccl-1f1b-cpu": RunDir(runs / "bf16-fp32-p1"),
        "nccl-zb_h1-cuda": RunDir(runs / "bf16-fp32-split"),
        "nccl-zb_h1-cpu": RunDir(runs / "bf16-fp32-p1"),
        "nccl-kc-1f1b": RunDir(runs / "timers-1f1b"),
        "nccl-kc-zb_h1": RunDir(runs / "timers-1f1b"),
    }
    mem = memory.judge(Machine("cuda", 1), stand_in)
    assert [r.verdict for r in mem.rows] == ["FAIL", "FAIL"] and any("peak allocated MiB" in x for x in mem.details)
    out = nccl.judge(Machine("cuda", 2), stand_in)
    assert [r.verdict for r in out.rows] == ["FAIL", "FAIL", "PASS", "PASS"], out.rows  # gloo vs gloo; the bubble holds
    assert "(gloo vs gloo)" in out.rows[0].figure


def test_a_failed_run_fails_its_check_with_the_runs_own_error(tmp_path):
    """A GPU run on a machine without one: each run exits with ppx run's one line, which
    becomes the check's figure."""
    from ppx.gpucheck.orchestrate import run_checks

    (res,) = run_checks(tmp_path, Machine("cuda", 1), 100, only=("timers",), echo=lambda line: None)
    assert res.outcome.verdict == "FAIL" and [r.dir for r in res.runs] == [None, None]
    why = "exit 2: ppx: error: runtime.device=cuda needs 1 GPUs on this node, found 0"
    assert all(r.figure.startswith(f"run timers-1f1b failed: {why}") for r in res.outcome.rows)


def test_a_run_past_the_budget_is_stopped_with_its_ranks(tmp_path):
    """A two-rank run (torchrun and its ranks) that outlives the budget is ended, every process
    of it, and says so."""
    name = f"stopme-{tmp_path.name}"
    keys = sizes.known_cost("1f1b", 2, 4, 1000.0, 1000.0, steps=20)
    runner = Runner(tmp_path, Machine("cpu", 0, small=True), time.monotonic() + 12)
    start = time.monotonic()
    result = runner.run(RunSpec.of(name, keys, 1.0))
    stopped = re.match(r"stopped after (\d+) s", result.why or "")  # (12 s less what starting it took)
    assert result.dir is None and stopped and 5 <= int(stopped.group(1)) <= 12, result.why
    assert time.monotonic() - start < 45
    left = [c for c in Path("/proc").glob("[0-9]*/cmdline") if name in _read(c)]
    assert left == [], [_read(c) for c in left]


def _read(cmdline: Path) -> str:
    try:
        return cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


def test_runs_that_do_not_fit_the_budget_are_skipped(tmp_path):
    r = ppx("gpu-check", "--on-cpu", "--only", "timers", "--budget-s", "1", "--out", str(tmp_path / "c"), timeout=120)
    assert r.returncode == 0, r.stderr
    (check,) = json.loads((tmp_path / "c" / "gpu-check.json").read_text())["checks"]
    assert check["verdict"] == "SKIPPED" and not (tmp_path / "c" / "runs" / "timers-1f1b").exists()
    # (1 s less what preparing took: 0 s on a loaded machine)
    assert re.search(r"time budget: -?[01] s left, the run needs about \d+ s", check["rows"][0]["figure"]), check


def test_bad_input_is_one_line_before_any_work(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "plain.md").write_text("no markers\n")
    cases = [
        (
            ["--only", "timers,nope"],
            "--only timers,nope: choose from timers, memory, saved, profiler, bf16, overlap, nccl, throughput",
        ),
        (["--budget-s", "0"], "--budget-s must be positive, got 0"),
        (["--gpus", "2"], "--gpus is for --dry-run"),
        (["--on-cpu", "--out", str(tmp_path / "taken")], "already exists (a check never overwrites one)"),
        (
            ["--on-cpu", "--out", str(tmp_path / "new"), "--docs", str(tmp_path / "plain.md")],
            "no <!-- gpu-check:begin -->",
        ),
        # a dry run checks what the check would write to, as the check does
        (["--dry-run", "--out", str(tmp_path / "taken")], "already exists (a check never overwrites one)"),
        (["--dry-run", "--docs", str(tmp_path / "plain.md")], "no <!-- gpu-check:begin -->"),
    ]
    for args, message in cases:
        r = ppx("gpu-check", *args, cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and message in r.stderr, (args, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.md", "taken"] and not any(
        (tmp_path / "taken").iterdir()
    )


def test_dry_run_lists_the_runs_of_a_machine_it_has_not(tmp_path):
    r = ppx("gpu-check", "--dry-run", "--gpus", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (
        "nccl: 6 runs" in r.stdout and "  nccl-1f1b-cuda: 2 processes, about" in r.stdout and "REFUSED" not in r.stdout
    )
    assert r.stdout.splitlines()[-1].startswith("total: about") and list(tmp_path.iterdir()) == []
    assert "split: 0 runs, about 0 s (and 2 of earlier checks')\n  throughput-1f1b: throughput's run" in r.stdout


@pytest.mark.timing
@pytest.mark.skipif(CUDA_DEVICES == 0, reason="needs a CUDA GPU")
def test_timers_and_profiler_on_the_gpus(tmp_path):
    r = ppx("gpu-check", "--only", "timers,profiler", "--out", str(tmp_path / "c"), env=GPU_ENV, timeout=300)
    data = json.loads((tmp_path / "c" / "gpu-check.json").read_text())
    assert r.returncode == 0, (tmp_path / "c" / "gpu-check.md").read_text()
    assert [row["verdict"] for c in data["checks"] for row in c["rows"]] == ["PASS"] * 4
