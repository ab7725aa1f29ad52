"""TensorBoard (a real server, its HTTP API), W&B (the offline run file read back), `ppx
compare` and a small sweep."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, free_port, ppx, read_json, wandb_file
from helpers.run import PROFILED_1F1B


@pytest.fixture(scope="module")
def profiled_run(shared_run):
    """Read only: test_instrumentation.py reads its profiler traces too (PROFILED_1F1B), from
    this run only where it was made alone (its timed test makes its own otherwise)."""
    s = shared_run(*PROFILED_1F1B)
    return s.root, s.dir, s.result


def _get(port: int, path: str, **params):
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _poll(fn, timeout_s: float = 90):
    """Call fn until it returns something truthy (TensorBoard loads logs in the background)."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
        except OSError as e:  # server not up yet
            last = e
        time.sleep(0.5)
    raise AssertionError(f"TensorBoard did not answer in {timeout_s} s ({last})")


def test_tensorboard_serves_scalars_and_profiler_workers(profiled_run):
    root, run, _ = profiled_run
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(root),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--load_fast=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        tb_run = f"1f1b_2cpu/{run.name}/tb"
        tags = _poll(lambda: _get(port, "/data/plugin/scalars/tags").get(tb_run))
        for tag in (
            "loss",
            "time/step_time_s",
            "bubble/measured",
            "bubble/theory",
            "bubble/theory_over_ideal",
            "compute_s/rank0",
            "transfer_s/rank1",
            "idle_s/rank1",
            "peak_inflight_microbatches/rank0",
            "peak_activation_bytes/rank1",
        ):
            assert tag in tags, tag
        loss = _get(port, "/data/plugin/scalars/scalars", run=tb_run, tag="loss")
        assert [step for _, step, _ in loss] == [0, 1, 2, 3, 4]
        assert [v for _, _, v in loss] == pytest.approx(read_json(run / "summary.json")["losses"], rel=1e-6)
        prof_run = tb_run  # one run: scalars and traces in <run>/tb
        runs = _poll(lambda: prof_run in _get(port, "/data/plugin/pytorch_profiler/runs")["runs"])
        assert runs
        workers = _get(port, "/data/plugin/pytorch_profiler/workers", run=prof_run, view="Overview")
        assert workers == ["rank0", "rank1"]
        # the plugin's steps are ppx's steps (wait 1, warmup 1, active 2: steps 2 and 3), each as long
        # as that rank's timed step in metrics.jsonl
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        for rank, worker in enumerate(workers):
            (span,) = _get(port, "/data/plugin/pytorch_profiler/spans", run=prof_run, worker=worker)
            overview = _get(port, "/data/plugin/pytorch_profiler/overview", run=prof_run, worker=worker, span=span)
            rows = overview["steps"]["rows"]
            assert [int(row[0]) for row in rows] == [2, 3]
            for row in rows:
                total_us = sum(v for v in row[1:] if isinstance(v, (int, float)))
                assert total_us / 1e6 == pytest.approx(lines[int(row[0])]["ranks"][rank]["step_s"], rel=0.05)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_wandb_offline_run_holds_the_logged_history(profiled_run):
    root, run, r = profiled_run
    (offline,) = (run / "wandb").glob("offline-run-*")
    assert f"ppx: W&B offline run: {offline} (upload: wandb sync {offline})" in r.stdout
    (wb,) = offline.glob("run-*.wandb")
    summary = read_json(run / "summary.json")
    rows = [row for row in wandb_file.history(wb) if "loss" in row]
    assert [row["loss"] for row in rows] == pytest.approx(summary["losses"], rel=1e-6)
    assert [row["_step"] for row in rows] == [0, 1, 2, 3, 4]
    # the pictures, the ranks' table and the report log at the last step, not at steps after it
    assert max(row["_step"] for row in wandb_file.history(wb)) == 4
    assert all("bubble/measured" in row and "compute_s/rank1" in row for row in rows)
    final = wandb_file.summary(wb)
    assert final["bubble_fraction"] == pytest.approx(summary["bubble_fraction"])
    # the runs table's names hold the run's figures (medians), not its last step's
    assert final["time/step_time_s"] == pytest.approx(summary["step_time_s"])
    assert final["time/throughput_samples_per_s"] == pytest.approx(summary["throughput_samples_per_s"])
    assert final["bubble/measured"] == pytest.approx(summary["bubble_fraction"])
    assert final["compute_s/rank1"] == pytest.approx(summary["ranks"][1]["compute_s"])
    assert final["predicted/step_time_s"] == pytest.approx(summary["predicted"]["step_time_s"])
    assert rows[-1]["time/step_time_s"] == pytest.approx(summary["step_times_s"][-1])  # (the history keeps each step's)
    p, m = summary["stages"], summary["microbatches"]
    assert final["bubble_fraction_theory"] == pytest.approx((p - 1) / (m + p - 1))
    assert final["timeline/_type"] == "image-file"  # the Gantt picture
    assert final["breakdown/_type"] == "image-file"  # the per-rank breakdown
    assert final["ranks/_type"] == "table-file" and final["ranks/nrows"] == 2  # the per-rank table
    assert final["report/_type"] == "html-file"  # report.html, as wandb.Html
    page = (run / "report.html").read_text()
    assert re.search(r'<div id="timeline"[^>]* data-ranks="2"', page) and 'id="breakdown"' in page
    assert f"ppx: report: {run / 'report.html'}\nppx: run directory: {run}" in r.stdout
    artifacts = [rec.artifact for rec in wandb_file.records(wb) if rec.WhichOneof("record_type") == "artifact"]
    (traces,) = [a for a in artifacts if a.type == "profiler-traces"]
    files = {e.path: Path(e.local_path) for e in traces.manifest.contents}
    assert "timeline.json" in files and any(f.startswith("traces/rank0.") for f in files), files
    # read where they are in the run directory: no copy of every trace kept outside it, run after run
    assert all(p.is_relative_to(run.resolve()) for p in files.values()), files
    info = wandb_file.run_info(wb)
    assert info["project"] == "ppx" and info["group"] == "1f1b_2cpu"
    assert info["config"]["pipeline"]["schedule"] == "1f1b"
    # an offline W&B starts once the steps are over (metrics.jsonl's last line written), never beside them
    assert info["start_time_s"] >= (run / "metrics.jsonl").stat().st_mtime
    assert wandb_file.exit_code(wb) == 0


@pytest.mark.plain_agent  # (a HOME of its own, which the servers' imports read: not theirs to serve)
def test_wandb_online_without_a_key_warns_once_and_goes_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path / "home")  # no ~/.netrc, no stored key
    env["WANDB_CONFIG_DIR"] = str(tmp_path / "wandb-config")
    d = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppx.cli",
            "run",
            "1f1b_2cpu",
            "train.steps=2",
            "logging.wandb.mode=online",
            "logging.report=false",
            f"run.dir={d}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [line for line in r.stderr.splitlines() if line.startswith("ppx: warning: W&B")]
    assert len(warnings) == 1 and "logging offline instead" in warnings[0]
    assert list((d / "wandb").glob("offline-run-*/run-*.wandb"))
    assert read_json(d / "summary.json")["status"] == "completed"


def test_small_sweep_and_compare(tmp_path):
    # costs far above a loaded CI machine's 0.5-2 ms hand-offs, so each point's bubble is the
    # schedule's, also beside other tests (measured beside the suite's multi-process tests:
    # bubbles within 0.002, predictions within 0.2 pt); a sweep across schedules charges them
    # per layer: 2 layers a stage, 20 and 40 ms
    r = ppx(
        "sweep",
        "1f1b_2cpu",
        "--sweep",
        "pipeline.schedule=gpipe,1f1b pipeline.microbatches=2,4",
        "model.kind=synthetic",
        "model.fwd_ms=10",
        "model.bwd_ms=20",
        "model.hidden=16",
        "train.steps=3",
        "logging.wandb.mode=disabled",
        f"run.root={tmp_path}",
        "run.dir=null",  # (as a plan's printed commands end it: no folder of its own, which a sweep is; it was refused)
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ppx sweep: model.cost_per=layer: the points vary pipeline.schedule" in r.stdout
    (sweep,) = (tmp_path / "1f1b_2cpu").glob("sweep-*")
    points = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert points == [
        "schedule=1f1b,microbatches=2",
        "schedule=1f1b,microbatches=4",
        "schedule=gpipe,microbatches=2",
        "schedule=gpipe,microbatches=4",
        "tb",  # the comparison's pictures and table, for TensorBoard
    ]
    assert list((sweep / "tb").glob("events.out.tfevents.*"))
    # its runs drew no pages (the tests' logging.report=false): nor does its comparison, the table only
    assert sorted(f.name for f in sweep.iterdir() if f.is_file()) == ["compare.json", "compare.md"]
    assert "ppx: report:" not in r.stdout
    table = (sweep / "compare.md").read_text()
    assert (
        table.count("| schedule=") == 4 and "| bubble | timeline bubble | predicted | pred err pt | theory |" in table
    )
    rows = json.loads((sweep / "compare.json").read_text())
    for row in rows:
        p, m = 2, row["microbatches"]
        assert row["theory"] == pytest.approx((p - 1) / (m + p - 1))
        assert row["bubble"] == pytest.approx(row["theory"], abs=0.08)
        assert abs(row["predicted_error_pt"]) < 5  # measured vs predicted bubble over the same steps
        assert row["step_range"] is None  # 3 steps: no quartiles (their range would be their extremes)
    assert "schedule=gpipe,microbatches=4" in r.stdout  # the terminal table
    assert "note: each config ran once, so this table holds none of this machine's run-to-run noise" in table
    # ppx compare on globs, into a chosen folder
    out = tmp_path / "cmp"
    c = ppx("compare", str(sweep / "schedule=gpipe*"), str(sweep / "schedule=1f1b,microbatches=4"), "--out", str(out))
    assert c.returncode == 0, c.stderr
    assert c.stdout.count("synthetic") == 3
    for png in ("compare.png", "bubble.png"):  # (ppx compare draws its pages)
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert (out / "compare.md").exists()
    assert f"ppx: report: {out / 'report.html'}" in c.stdout and 'id="bubble"' in (out / "report.html").read_text()
    assert f"ppx: wrote {out / 'compare.md'}, {out / 'compare.json'}, {out / 'compare.png'}" in c.stdout
    before = (out / "compare.md").read_text()
    again = ppx("compare", str(sweep), "--out", str(out))  # never over an earlier comparison
    assert (again.returncode, again.stderr) == (
        2,
        f"ppx: error: --out {out} exists and is not empty; give a new folder\n",
    )
    assert (out / "compare.md").read_text() == before
    run = next(sweep.glob("schedule=gpipe*"))  # nor into a run: its report.html and tb/ would be the comparison's
    files = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    into_run = ppx("compare", str(sweep), "--out", str(run))
    assert into_run.returncode == 2 and into_run.stderr.count("\n") == 1, into_run.stderr
    assert f"--out {run} is a run's folder; ppx never writes into a run" in into_run.stderr
    below = ppx("compare", str(sweep), "--out", str(run / "tb" / "cmp"))  # nor into a folder of a run
    assert below.returncode == 2 and f"is a path inside the run {run};" in below.stderr, below.stderr
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == files


def test_compare_rejects_nothing_to_compare(tmp_path):
    r = ppx("compare", str(tmp_path / "nothing*"))
    assert r.returncode == 2 and r.stderr.strip() == f"ppx: error: no run matches '{tmp_path / 'nothing*'}'"
