"""``ppx run`` watches every job it starts to its end: one CPU rank alone, and a torchrun whose
agent stops after the ranks have done their work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, free_port, ppx
from helpers.job import end, parent_pid, read_log, start_run, wait_for_step, workers
from ppx import config
from ppx.launch.claim import write_config
from ppx.launch.heartbeat import beat_path, read_beat
from ppx.launch.watchdog import status_path

pytestmark = pytest.mark.plain_agent  # how a job starts and ends, as a user's does (tests/conftest.py)


def test_a_killed_rank_alone_on_cpu_is_named_too(run_dir):
    """One CPU rank (pipeline.stages=1) is a forked rank of a watched job as any other: it ran
    inside ``ppx run`` once, where its death said nothing and left no incomplete.txt."""
    r = ppx(
        "run",
        "gpipe_2cpu",
        "pipeline.stages=1",
        "runtime.inject_fault=die@0B1",
        f"run.dir={run_dir}",
        timeout=120,
    )
    assert r.returncode != 0
    line = "rank 0 died: killed by signal SIGKILL (9) on 0B1 (step 0)"
    assert [x for x in r.stderr.splitlines() if x.startswith("ppx: error:")] == [f"ppx: error: {line}"], r.stderr
    assert (run_dir / "incomplete.txt").read_text() == f"{line}\n"


def test_a_rank_beats_while_the_ranks_meet(tmp_path):
    """A rank under ``ppx run`` beats from before its process group is up: one frozen while the
    ranks meet is named by the launcher after runtime.timeout_s (its peers' rendezvous took 60 s
    to give up, then torchrun 30 s more to kill it). Rank 1 of 2 alone, its peer never coming,
    beats while it waits (it beat only once the group was up)."""
    run = tmp_path / "run"
    run.mkdir()
    write_config(run, config.load("1f1b_2cpu", ["runtime.timeout_s=300"]))
    env = {
        **os.environ,
        **dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", PPX_DEVICE="cpu"),
        **dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())),  # (no one listens there)
    }
    proc = subprocess.Popen([sys.executable, "-m", "ppx.launch.worker", str(run)], env=env, cwd=REPO)
    try:
        path, deadline = beat_path(run / "status", 1), time.monotonic() + 60
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        first = read_beat(path, 1)
        assert first is not None, f"no heartbeat while the ranks meet (exit code {proc.poll()})"
        time.sleep(2.5)  # (a beat a second)
        later = read_beat(path, 1)
        assert proc.poll() is None and later.count > first.count and later.state == "alive", (first, later)
        assert not status_path(run / "status", 1).exists()  # (no watchdog yet: the group is not up)
    finally:
        proc.kill()
        proc.wait()


def test_a_frozen_torchrun_after_a_complete_run_is_ended_and_the_run_kept(run_dir, tmp_path):
    """torchrun's agent stopped (SIGSTOP) mid-run: the ranks finish without it, and ``ppx run``
    ends the job runtime.timeout_s after every rank is done, exit 0, the run complete (it
    waited for torchrun forever, and a SIGTERM then marked the complete run incomplete)."""
    code, out = _signal_the_agent(run_dir, tmp_path, signal.SIGSTOP, "runtime.timeout_s=4", "train.steps=15")
    assert code == 0, out[-3000:]
    assert "ppx: torchrun had not ended" in out and "(the run is complete: " in out, out[-3000:]
    assert (run_dir / "summary.json").exists() and not (run_dir / "incomplete.txt").exists()


def test_a_frozen_torchrun_and_a_killed_rank_end_the_job_naming_the_rank(run_dir, tmp_path):
    """torchrun's agent stopped, then rank 1 killed: neither reaps nor reports it, and rank 0,
    finding its peer gone, leaves the naming to the launcher. ``ppx run`` ends the job
    runtime.timeout_s after every rank has ended, naming the killed rank from its exit status
    (it waited for torchrun until a SIGTERM, naming nobody)."""
    code, out = _signal_the_agent(run_dir, tmp_path, signal.SIGSTOP, "runtime.timeout_s=4", rank1=signal.SIGKILL)
    assert code == 1, out[-3000:]
    errors = [x for x in out.splitlines() if x.startswith("ppx: error: ")]
    assert len(errors) == 2 and errors[0].startswith("ppx: error: rank 1 died: killed by signal SIGKILL (9) on ")
    assert errors[1].startswith("ppx: error: torchrun had not ended "), out[-3000:]
    assert (run_dir / "incomplete.txt").read_text() == "".join(x[len("ppx: error: ") :] + "\n" for x in errors)


def test_a_killed_torchrun_leaves_no_started_rank_running(run_dir, tmp_path):
    """torchrun's agent killed (kill -9) under started ranks (sessions of their own, as a CUDA
    run's always are): ``ppx run`` names it and ends the ranks, which had run on without it to
    the run's end (summary.json beside incomplete.txt)."""
    code, out = _signal_the_agent(run_dir, tmp_path, signal.SIGKILL, "runtime.fork_ranks=false", "runtime.timeout_s=5")
    assert code == 137, out[-3000:]
    assert "ppx: error: torchrun, which runs the ranks, was killed by signal SIGKILL (9); " in out, out[-3000:]
    time.sleep(1)  # (a rank left would write its next step's status)
    assert not (run_dir / "summary.json").exists() and (run_dir / "incomplete.txt").exists()


def _signal_the_agent(run_dir, tmp_path, sig, *overrides, rank1=None) -> tuple[int, str]:
    """A gpipe_2cpu ``ppx run`` to step 2, then ``sig`` to torchrun's agent (and ``rank1`` to
    rank 1): (its exit code, its output), once it has ended with nothing of the job left."""
    proc, log = start_run("gpipe_2cpu", run_dir, tmp_path, *overrides)
    try:
        wait_for_step(run_dir, 2)
        job = workers(run_dir)  # (the agent: ppx run's child, or its agent server's: ppx/launch/early_agent.py)
        (agent,) = [pid for pid in job if parent_pid(pid) not in job]
        os.kill(agent, sig)
        if rank1 is not None:
            os.kill(read_beat(beat_path(run_dir / "status", 1), 1).pid, rank1)
        proc.wait(timeout=120)
        assert workers(run_dir) == [], read_log(log)[-3000:]
        return proc.returncode, read_log(log)
    finally:
        end(proc, run_dir)
