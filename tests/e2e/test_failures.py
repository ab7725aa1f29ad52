"""A rank that hangs, freezes or dies ends the whole job, non-zero, naming the rank and its
action; so does a SIGTERM or SIGINT to ``ppx run``, and no process of the job is left."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, ppx, torchrun_ppx
from helpers.job import LONG_RUN, RANK0_UNTIL_B1, end, parent_pid, read_log, signal_mid_run, start_run, wait_for_step
from ppx.launch.heartbeat import read_beat
from ppx.launch.processes import forked_worker_path
from ppx.launch.watchdog import read_status

pytestmark = pytest.mark.plain_agent  # how a job starts and ends, as a user's does (tests/conftest.py)


@pytest.mark.timing
@pytest.mark.parametrize(
    ("experiment", "executor", "action"), [("gpipe_2cpu", "ppx", "1F2"), ("1f1b_2cpu", "torch", "1F1")]
)
def test_hung_rank_ends_the_job_within_the_timeout(run_dir, experiment, executor, action):
    start = time.monotonic()
    # 6 s: rank 0, waiting on the hung rank, allows itself 1.5 s more, so rank 1 names itself first
    # (torch's executor receives inside its own schedule: rank 0 waits there after its last action,
    # 0F2 in 1F1B, and was named instead of rank 1)
    r = ppx(
        "run",
        experiment,
        f"pipeline.executor={executor}",
        "runtime.timeout_s=6",
        f"runtime.inject_fault=hang@{action}",
        f"run.dir={run_dir}",
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    # one line: the hung rank's; rank 0, its peer gone from under its wait, says nothing more
    errors = [line for line in r.stderr.splitlines() if line.startswith("ppx: error: ")]
    assert len(errors) == 1 and errors[0].startswith("ppx: error: rank 1 made no progress for 6."), r.stderr
    assert errors[0].endswith(f"on {action} (step 0); ending the job (runtime.timeout_s=6)")
    assert f"ppx: run directory (incomplete): {run_dir}" in r.stderr
    why, where = (run_dir / "incomplete.txt").read_text().splitlines()  # the cause, then where each rank was
    assert why == errors[0].removeprefix("ppx: error: ")
    assert "where each rank was: rank 0: " in where and f"rank 1: {action} (step 0)" in where
    assert elapsed < 60  # start-up + 6 s timeout + teardown, never a silent hang
    assert "Traceback" not in r.stderr  # ppx's lines and torchrun's one line, no launcher traceback
    assert len(r.stderr.splitlines()) <= 4, r.stderr  # (torch's runtime logs no schedule of its own)
    assert not (run_dir / "summary.json").exists()


def test_killed_rank_ends_the_job_and_is_named(run_dir):
    r = ppx(
        "run", "1f1b_2cpu", "runtime.timeout_s=30", "runtime.inject_fault=die@1B1", f"run.dir={run_dir}", timeout=120
    )
    assert r.returncode != 0
    # the launcher names the killed rank, the signal and its action (torchrun's exit codes and
    # the rank's status file)
    assert "ppx: error: rank 1 died: killed by signal SIGKILL (9) on 1B1 (step 0)\n" in r.stderr, r.stderr
    # one line: the survivor, its wait failed by the closed connection, finds its peer's
    # process gone and leaves the naming to the launcher
    assert [line for line in r.stderr.splitlines() if line.startswith("ppx: error:")] == [
        "ppx: error: rank 1 died: killed by signal SIGKILL (9) on 1B1 (step 0)"
    ], r.stderr
    # the survivor's status holds the wait it was on, "failed on" it, where its wait failed before
    # torchrun's SIGTERM (within its 0.5 s monitor interval of the death) ended it; where the
    # SIGTERM came first (a loaded machine that did not schedule it in time; CI saw this), the
    # item it was on
    where = read_status(run_dir / "status" / "rank0.txt")
    # (a compute or a post that failed would be a bug of its own: only a wait fails on the death)
    assert re.fullmatch(rf"(failed on wait 0RECV_B[01] from rank 1|{RANK0_UNTIL_B1}) \(step 0\)", where), where
    assert "rank 0 died" not in r.stderr and "stopped responding" not in r.stderr  # the survivor is not blamed
    assert "where each rank was" not in r.stderr  # the died line says what it would
    assert "torchrun:" not in r.stderr and "Traceback" not in r.stderr
    assert (run_dir / "incomplete.txt").read_text() == "rank 1 died: killed by signal SIGKILL (9) on 1B1 (step 0)\n"
    assert read_status(run_dir / "status" / "rank1.txt") == "1B1 (step 0)"
    assert (run_dir / "status" / "rank1.txt").read_text().rstrip() == "1B1 (step 0)"  # a plain text line


def test_a_loss_that_is_not_finite_stops_the_run_naming_the_step(run_dir):
    """train.lr=3e38 sends the weights to inf after the first step: the loss turns nan, and the
    run stops there, non-zero, in one line, rather than time NaN arithmetic and exit 0."""
    r = ppx("run", "gpipe_2cpu", "train.lr=3e38", f"run.dir={run_dir}", timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("ppx: error: ")]
    assert errors == [
        "ppx: error: rank 1 failed on step metrics (step 1): LossNotFinite: the loss is nan at step 1 "
        "(train.lr=3e+38); the run stops"
    ], r.stderr
    step0 = re.search(r"step 0 \(1/10\)  loss (\S+)", r.stdout)  # step 0 was finite, reported as usual
    assert step0 and math.isfinite(float(step0.group(1))), r.stdout
    assert not (run_dir / "summary.json").exists() and (run_dir / "incomplete.txt").exists()


def test_killed_rank_is_named_by_its_peer_without_ppx_run(run_dir):
    """Started by torchrun itself (as under srun), with no `ppx run` to read torchrun's exit
    codes: the survivor finds the killed peer's process gone and names it, in one line."""
    r = torchrun_ppx(
        2, "run", "1f1b_2cpu", "runtime.timeout_s=30", "runtime.inject_fault=die@1B1", f"run.dir={run_dir}"
    )
    assert r.returncode != 0
    ours = [line for line in r.stderr.splitlines() if line.startswith("ppx: error:")]
    assert len(ours) == 1, r.stderr[-3000:]
    # rank 0 waits on one of rank 1's gradients, or is on its way there (`RANK0_UNTIL_B1`)
    assert re.fullmatch(
        rf"ppx: error: rank 1 died on 1B1 \(step 0\): its process ended \(rank 0 was on {RANK0_UNTIL_B1} \(step 0\)\)",
        ours[0],
    ), ours
    assert (run_dir / "status" / "cause.txt").read_text() == ours[0].removeprefix("ppx: error: ") + "\n"


def test_a_survivor_stopped_mid_compute_still_names_the_killed_peer(run_dir):
    """torchrun SIGTERMs rank 0 within its monitor interval of rank 1's death, while rank 0 is
    in a 120 s backward (the known-cost model) and has no failed wait to notice it by: rank 0
    still names rank 1, and ends by the SIGTERM (start-up and seconds, not the backward's 120)."""
    start = time.monotonic()
    r = torchrun_ppx(
        2,
        "run",
        "1f1b_2cpu",
        "model.kind=synthetic",
        "model.hidden=16",
        "model.bwd_ms=[120000,1]",
        "runtime.timeout_s=240",
        "runtime.inject_fault=die@1B1",
        f"run.dir={run_dir}",
    )
    assert r.returncode != 0
    ours = [line for line in r.stderr.splitlines() if line.startswith("ppx: error:")]
    # (on 0B0, unless a loaded machine kept rank 1's gradient for it from leaving before the kill,
    # or kept rank 0 from its wait)
    assert len(ours) == 1 and re.fullmatch(
        r"ppx: error: rank 1 died on 1B1 \(step 0\): its process ended "
        r"\(rank 0 was on (0B0|wait 0RECV_B0 from rank 1|0SEND_F1( 0RECV_B\d)*) \(step 0\)\)",
        ours[0],
    ), r.stderr[-3000:]
    assert "exitcode  : -15" in r.stderr  # rank 0 ended by the SIGTERM, as without ppx's handling
    assert time.monotonic() - start < 100  # (start-up on a loaded machine, and not the backward's 120 s)


def test_ranks_stopped_together_end_at_once_naming_nobody(run_dir, tmp_path):
    """scancel's SIGTERM to every rank of a torchrun job: each ends by it within seconds, mid
    compute or mid wait, and none names another as died (each says "stopped" first)."""
    log = open(tmp_path / "torchrun.log", "w+")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ppx.cli"]
    proc = subprocess.Popen(
        [*cmd, "run", "1f1b_2cpu", *LONG_RUN, f"run.dir={run_dir}"], cwd=REPO, stdout=log, stderr=log
    )
    try:
        wait_for_step(run_dir, 2)
        pids = [read_beat(run_dir / "status" / f"rank{r}.beat", r).pid for r in range(2)]
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=60)
        assert time.monotonic() - sent < 10
    finally:
        end(proc, run_dir)
    out = read_log(log)
    assert "ppx: error:" not in out, out[-3000:]
    assert out.count("exitcode  : -15") == 2, out[-3000:]
    assert [read_beat(run_dir / "status" / f"rank{r}.beat", r).state for r in range(2)] == ["stopped", "stopped"]


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


@pytest.mark.timing
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


# a run long enough to be stopped in the middle: the known-cost model sleeps its actions out,
# so the ranks cost the machine little while they wait for the test
@pytest.mark.timing
def test_frozen_rank_is_named_and_the_job_ends_within_the_timeout(run_dir, tmp_path):
    """SIGSTOP on rank 2 of 4: the launcher sees its heartbeat stop, names it with its action
    and ends the job (SIGKILL after a 2 s grace, not torchrun's 30 s) within timeout_s + 5 s."""
    timeout_s = 6
    proc, log = start_run("gpipe_4gpu", run_dir, tmp_path, f"runtime.timeout_s={timeout_s}")
    frozen = lambda: os.kill(read_beat(run_dir / "status" / "rank2.beat", 2).pid, signal.SIGSTOP)  # noqa: E731
    took, left = signal_mid_run(proc, run_dir, 4, frozen, timeout=120)
    out = read_log(log)
    print(f"the job ended {took:.1f} s after the SIGSTOP (runtime.timeout_s={timeout_s})")
    assert proc.returncode == 1, out[-3000:]
    where = read_status(run_dir / "status" / "rank2.txt")
    assert f"ppx: error: rank 2 stopped responding (no heartbeat for {timeout_s}." in out, out[-3000:]
    assert f"); it was on {where}\n" in out and "(step " in where
    assert took < timeout_s + 5, out[-3000:]
    assert left == [], f"processes left: {left}"
    # one account of the failure: no rank blames itself or a waiting peer, torchrun stays quiet
    assert "made no progress" not in out and "died" not in out and "Traceback" not in out, out[-3000:]
    assert "torchrun" not in out and "SIGTERM" not in out, out[-3000:]
    assert (run_dir / "incomplete.txt").read_text().startswith("rank 2 stopped responding")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["KILL", "SEGV"])
def test_rank_killed_from_outside_is_named_with_the_signal(run_dir, tmp_path, sig):
    """A crash's (SIGSEGV's) Python stacks go to the rank's file in status/, which the line
    names: torch's faulthandler printed 70-odd lines of them before it."""
    proc, log = start_run("1f1b_2cpu", run_dir, tmp_path, "runtime.timeout_s=30")
    killed = lambda: os.kill(read_beat(run_dir / "status" / "rank1.beat", 1).pid, sig)  # noqa: E731
    _, left = signal_mid_run(proc, run_dir, 2, killed, timeout=60)
    out = read_log(log)
    where = read_status(run_dir / "status" / "rank1.txt")
    assert proc.returncode == 1, out[-3000:]
    stacks = run_dir / "status" / "rank1.stacks"
    line = f"rank 1 died: killed by signal {sig.name} ({sig.value}) on {where}"
    if sig == signal.SIGSEGV:
        line += f"; Python's stacks at the crash: {stacks}"
        assert stacks.read_text().startswith("Fatal Python error: Segmentation fault")
    assert out.splitlines()[-2:] == [f"ppx: error: {line}", f"ppx: run directory (incomplete): {run_dir}"], out[-3000:]
    assert "Fatal Python error" not in out and "(step " in where and left == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_cpu_rank_is_forked_from_torchrun_and_ends_on_a_signal_as_a_started_one(run_dir, tmp_path, sig):
    """On CPU torchrun forks the ranks from its agent (ppx/launch/forked_worker.py), whose
    SIGTERM handler raises torchrun's SignalException: a rank SIGTERMed from outside ends by
    the signal's default action, as a started process would, with no error line of its own
    (with the agent's handler it would name itself: "rank 1 failed on ...: SignalException").
    A SIGINT ends it by SIGINT, named as such (torch's fork wrapper would make it exit 0), and
    a SIGTERM (a plain `kill`) is named too: its peer, failing, found it gone, so it is no
    survivor torchrun SIGTERMed after the first failure."""
    proc, log = start_run("1f1b_2cpu", run_dir, tmp_path, "runtime.timeout_s=30")
    seen = {}

    def term() -> None:
        pid = read_beat(run_dir / "status" / "rank1.beat", 1).pid
        parent = parent_pid(pid)
        seen["rank"] = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        seen["parent"] = open(f"/proc/{parent}/cmdline", "rb").read().split(b"\0")
        os.kill(pid, sig)

    _, left = signal_mid_run(proc, run_dir, 2, term, timeout=60)
    out = read_log(log)
    assert forked_worker_path().encode() in seen["rank"]
    assert seen["rank"] == seen["parent"] and b"ppx.launch.torchrun" in seen["parent"]  # forked: the agent's
    assert proc.returncode == 1, out[-3000:]
    assert "SignalException" not in out and "rank 1 failed" not in out, out[-3000:]
    assert f"ppx: error: rank 1 died: killed by signal {sig.name} ({int(sig)}) on " in out, out[-3000:]
    assert left == []


@pytest.mark.parametrize(
    "sig,experiment,world,fork",
    [
        (signal.SIGTERM, "gpipe_4gpu", 4, True),
        (signal.SIGINT, "1f1b_2cpu", 2, True),
        (signal.SIGUSR1, "1f1b_2cpu", 2, False),  # (a job manager's warning)
        (signal.SIGTERM, "1f1b_2cpu", 1, False),
        (signal.SIGINT, "1f1b_2cpu", 1, False),
    ],
    ids=["TERM", "INT", "USR1-started-ranks", "TERM-one-rank-in-process", "INT-one-rank-in-process"],
)
def test_stopping_ppx_run_ends_its_whole_job(run_dir, tmp_path, sig, experiment, world, fork):
    """`kill -TERM` (a `timeout`, a job manager) or Ctrl-C on `ppx run`: forwarded to the job,
    every worker gone within seconds, exit 128 + the signal, the run folder says it stopped;
    with the ranks forked from torchrun (CPU) or started as their own processes (as on CUDA),
    and one rank that cannot be forked, run inside `ppx run` (a GPU's; on CPU with fork_ranks=false)."""
    stages = ["pipeline.stages=1"] if world == 1 else []
    proc, log = start_run(experiment, run_dir, tmp_path, f"runtime.fork_ranks={str(fork).lower()}", *stages)
    took, left = signal_mid_run(proc, run_dir, world, lambda: proc.send_signal(sig), timeout=60)
    out = read_log(log)
    print(f"ppx run ended {took:.1f} s after {sig.name}")
    assert proc.returncode == 128 + sig, out[-3000:]
    assert left == [], f"processes left: {left}"
    assert took < 10
    assert out.rstrip().endswith(
        f"ppx: stopped by {sig.name}: the job was ended; run directory (incomplete): {run_dir}"
    )
    assert "Traceback" not in out and "error" not in out, out[-3000:]
    why = (run_dir / "incomplete.txt").read_text()
    assert why.startswith(f"stopped: ppx run received {sig.name} after "), why
    assert re.search(r"where each rank was: rank 0: .*\(step \d+\)", why), why


FROZEN_PEER = """
import os, sys, time
from pathlib import Path
from ppx.launch.watchdog import Watchdog
status = Path(sys.argv[1])
status.mkdir()
(status / "rank1.beat").write_text(f"{os.getppid()} host 7 {time.time() - 3:.1f} alive")  # stopped beating
(status / "rank1.txt").write_text("1F3 (step 2)")
w = Watchdog(0, 1.0, status, poll_s=0.05)
w.phase("wait 0RECV_B3 from rank 1", 2)
w.start()
print(time.time(), flush=True)
time.sleep(60)
"""


@pytest.mark.timing
@pytest.mark.parametrize("launcher", [False, True], ids=["alone", "under-ppx-run"])
def test_watchdog_names_a_frozen_peer_instead_of_itself(tmp_path, launcher):
    """A rank stalled in a wait reads its peers' heartbeats: one that has stopped is named as the
    cause, not this rank. Under torchrun or srun of the user's, the watchdog says so and ends its
    process; under `ppx run`, whose launcher names the rank and ends the job itself, it waits a
    full timeout more first, so that one line names the frozen rank."""
    env = {k: v for k, v in os.environ.items() if k != "PPX_LAUNCHER_PID"}
    if launcher:
        env["PPX_LAUNCHER_PID"] = str(os.getpid())  # alive: the watchdog leaves the job to it, once
    r = subprocess.run(
        [sys.executable, "-c", FROZEN_PEER, str(tmp_path / "status")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    elapsed = time.time() - float(r.stdout)  # from the watchdog's start
    assert r.returncode == 3, r.stderr
    assert "ppx: error: rank 1 stopped responding (no heartbeat for " in r.stderr
    assert "; it was on 1F3 (step 2) (seen by rank 0, which ends its process; runtime.timeout_s=1)" in r.stderr
    assert "made no progress" not in r.stderr
    # limit 2 s (1 s + 1 s grace), then 2.5 s reading the heartbeats; deferred: all of it twice
    assert (elapsed > 8.0) if launcher else (4.0 < elapsed < 7.0), elapsed


def test_a_stopped_sweep_ends_its_running_point_and_runs_no_more(tmp_path):
    """SIGTERM to ``ppx sweep`` goes on to the running point's ``ppx run``, which ends its job
    and marks its run incomplete; the sweep exits 128 + 15 and starts no later point."""
    log = open(tmp_path / "sweep.log", "w+")
    cmd = [sys.executable, "-m", "ppx.cli", "sweep", "1f1b_2cpu", "--sweep", "pipeline.microbatches=2,4"]
    proc = subprocess.Popen(
        [*cmd, *LONG_RUN, f"run.root={tmp_path}"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while not list((tmp_path / "1f1b_2cpu").glob("sweep-*/microbatches=2/status")) and time.monotonic() < deadline:
        time.sleep(0.2)
    (point,) = (tmp_path / "1f1b_2cpu").glob("sweep-*/microbatches=2")
    took, left = signal_mid_run(proc, point, 2, lambda: proc.send_signal(signal.SIGTERM), timeout=60)
    out = read_log(log)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "ppx sweep: stopped by SIGTERM: point 1/2 was ended, no later point ran" in out, out[-3000:]
    assert (point / "incomplete.txt").read_text().startswith("stopped: ppx run received SIGTERM")
    assert not (point.parent / "microbatches=4").exists() and left == [], left
    assert took < 10, out[-3000:]
