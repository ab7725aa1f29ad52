"""A rank that hangs or dies ends the whole job, non-zero, naming the rank and its action."""

from __future__ import annotations

import subprocess
import sys
import time

from helpers import REPO, ppx
from ppx.launch.watchdog import read_status


def test_hung_rank_ends_the_job_within_the_timeout(run_dir):
    start = time.monotonic()
    # 6 s: rank 0, waiting on the hung rank, allows itself 1.5 s more, so rank 1 names itself first
    r = ppx(
        "run", "gpipe_2cpu", "runtime.timeout_s=6", "runtime.inject_fault=hang@1F2", f"run.dir={run_dir}", timeout=120
    )
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    assert "ppx: error: rank 1 made no progress for 6." in r.stderr
    assert "on 1F2 (step 0); ending the job (runtime.timeout_s=6)" in r.stderr
    assert "where each rank was: rank 0: " in r.stderr and "rank 1: 1F2 (step 0)" in r.stderr
    assert elapsed < 60  # start-up + 6 s timeout + teardown, never a silent hang
    assert "Traceback" not in r.stderr  # ppx's lines and torchrun's one line, no launcher traceback
    assert not (run_dir / "summary.json").exists()


def test_killed_rank_ends_the_job_and_is_named(run_dir):
    r = ppx(
        "run", "1f1b_2cpu", "runtime.timeout_s=30", "runtime.inject_fault=die@1B1", f"run.dir={run_dir}", timeout=120
    )
    assert r.returncode != 0
    # the launcher names where each rank was; the survivor, unless torchrun stopped it first,
    # names its own rank and action too
    assert "rank 1: 1B1 (step 0)" in r.stderr
    assert "ppx: error: rank 0 failed at step 0 on wait 0RECV_B" in r.stderr or "rank 0: wait 0RECV_B" in r.stderr, (
        r.stderr
    )
    assert "from rank 1" in r.stderr
    # torchrun names the killed rank (the survivor has usually exited by then, with code 1)
    assert (
        "torchrun: ppx.launch.worker failed: rank 0: exit code " in r.stderr
        and "rank 1: exit code -9 (SIGKILL)" in r.stderr
    )
    assert "Traceback" not in r.stderr
    assert read_status(run_dir / "status" / "rank1.txt") == "1B1 (step 0)"
    assert (run_dir / "status" / "rank1.txt").read_text().rstrip() == "1B1 (step 0)"  # a plain text line


WATCHDOG_ON_A_GPU = """
import sys, time
from ppx.launch.watchdog import Watchdog
w = Watchdog(0, 1.0, sys.argv[1], poll_s=0.05)
start = time.monotonic()
# the GPU finishes an action every 0.1 s for 3 s, then sticks on 0B5
w.device_position = lambda: f"0F{int((time.monotonic() - start) * 10)}" if time.monotonic() - start < 3 else "0B5"
w.phase("step start", 3)
w._set("wait sends")  # the host waits at the end of the step it queued
w.start()
time.sleep(30)
"""


def test_watchdog_follows_the_gpu_and_names_where_it_hangs(tmp_path):
    # on a GPU, the host waits at the end of a step it queued ahead: the GPU moving on is
    # progress, and a hang is named by the action the GPU is stuck on (the CUDA timer's events)
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", WATCHDOG_ON_A_GPU, str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    elapsed = time.monotonic() - start
    assert r.returncode == 3, r.stderr
    assert "rank 0 made no progress for 2." in r.stderr  # timeout 1 s + 1 s grace, counted from the last move
    assert "on wait sends (step 3); the GPU is on 0B5; ending the job" in r.stderr
    assert elapsed > 4.5  # 3 s of GPU progress kept it alive past the 2 s limit
    assert read_status(tmp_path / "rank0.txt") == "wait sends (step 3); the GPU is on 0B5"


def test_a_sweep_with_a_failed_point_compares_the_rest_and_exits_1(tmp_path):
    """One point's forward (12 s) outlives runtime.timeout_s=5: the watchdog ends that run, the
    sweep goes on, compares what completed, names the failure and exits 1."""
    r = ppx(
        "sweep",
        "1f1b_2cpu",
        "--sweep",
        "model.fwd_ms=5,12000",
        "model.kind=synthetic",
        "model.hidden=16",
        "train.steps=2",
        "runtime.timeout_s=5",
        "logging.wandb.mode=disabled",
        f"run.root={tmp_path}",
        timeout=180,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "ppx sweep: 1 run(s) failed: model.fwd_ms=12000" in r.stderr
    (sweep,) = (tmp_path / "1f1b_2cpu").iterdir()
    assert (sweep / "fwd_ms=5" / "summary.json").exists() and not (sweep / "fwd_ms=12000" / "summary.json").exists()
    table = (sweep / "compare.md").read_text()
    assert "fwd_ms=5" in table and "fwd_ms=12000" not in table
