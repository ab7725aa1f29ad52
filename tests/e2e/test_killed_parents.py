"""Nothing of a sweep's point outlives the sweep: a kill -9 of ``ppx sweep`` is a SIGTERM to the
point's ``ppx run`` (PR_SET_PDEATHSIG, `ppx.launch.processes.follow_parent`), which ends its job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, ppx
from helpers.job import LONG_RUN, wait_for_step, workers

pytestmark = pytest.mark.plain_agent  # how a job starts and ends, as a user's does (tests/conftest.py)


def test_a_killed_sweep_leaves_no_point_running(tmp_path):
    """kill -9 of ``ppx sweep``: its running point's ``ppx run`` (and so its job) is ended as a
    stopped one is, its run marked incomplete; they ran on to the point's end."""
    cmd = [sys.executable, "-m", "ppx.cli", "sweep", "1f1b_2cpu", "--sweep", "pipeline.microbatches=2,4"]
    proc = subprocess.Popen([*cmd, *LONG_RUN, f"run.root={tmp_path}"], cwd=REPO, stdout=subprocess.DEVNULL)
    point = tmp_path / "none"
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "1f1b_2cpu").glob("sweep-*/microbatches=2/status")) and time.monotonic() < deadline:
            time.sleep(0.2)
        (point,) = (tmp_path / "1f1b_2cpu").glob("sweep-*/microbatches=2")
        wait_for_step(point, 2)
        proc.kill()
        deadline = time.monotonic() + 15
        while workers(point, launcher=True) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert workers(point, launcher=True) == []
        assert (point / "incomplete.txt").read_text().startswith("stopped: ppx run received SIGTERM")
    finally:
        for pid in workers(point, launcher=True):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_a_point_whose_sweep_has_ended_does_not_start(tmp_path):
    """The sweep gone before its point asked to follow it: the point says so and does not
    start; a pid left in the environment that is alive but not its parent is no death."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # (its pid names no process now)
    gone = ppx("run", "1f1b_2cpu", f"run.dir={tmp_path / 'gone'}", env={"PPX_SWEEP_PID": str(ended.pid)})
    said = f"ppx: stopped: the ppx sweep that started this run (pid {ended.pid}) has ended\n"
    assert (gone.returncode, gone.stderr) == (143, said)
    assert not (tmp_path / "gone").exists()
    alive = ppx("run", "1f1b_2cpu", "train.steps=1", f"run.dir={tmp_path / 'alive'}", env={"PPX_SWEEP_PID": "1"})
    assert alive.returncode == 0 and (tmp_path / "alive" / "summary.json").exists(), alive.stderr[-2000:]
