"""A rank that hangs or dies ends the whole job, non-zero, naming the rank and its action."""

from __future__ import annotations

import time

from conftest import ppx
from ppx.watchdog import read_status


def test_hung_rank_ends_the_job_within_the_timeout(run_dir):
    start = time.monotonic()
    r = ppx("run", "gpipe_2cpu", "runtime.timeout_s=3", "runtime.inject_fault=hang@1F2", f"run.dir={run_dir}", timeout=120)
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    assert "ppx: error: rank 1 made no progress for 3." in r.stderr
    assert "on 1F2 (step 0); ending the job (runtime.timeout_s=3)" in r.stderr
    assert "where each rank was: rank 0: " in r.stderr and "rank 1: 1F2 (step 0)" in r.stderr
    assert elapsed < 60  # start-up + 3 s timeout + teardown, never a silent hang
    assert "Traceback" not in r.stderr  # ppx's lines and torchrun's one line, no launcher traceback
    assert not (run_dir / "summary.json").exists()


def test_killed_rank_ends_the_job_and_is_named(run_dir):
    r = ppx("run", "1f1b_2cpu", "runtime.timeout_s=30", "runtime.inject_fault=die@1B1", f"run.dir={run_dir}", timeout=120)
    assert r.returncode != 0
    # the survivor names its own rank and action; the launcher names where the dead one was
    assert "ppx: error: rank 0 failed at step 0 on wait 0RECV_B" in r.stderr and "from rank 1" in r.stderr
    assert "rank 1: 1B1 (step 0)" in r.stderr
    assert "torchrun: ppx.worker failed: rank 0: exit code 1; rank 1: exit code -9 (SIGKILL)" in r.stderr
    assert "Traceback" not in r.stderr
    assert read_status(run_dir / "status" / "rank1.txt") == "1B1 (step 0)"
