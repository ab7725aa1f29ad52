"""A ``ppx run`` in the background for the failure tests: started, followed to a step, its
processes found in /proc, and nothing of it left when a test ends."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from helpers import REPO
from ppx.launch.processes import stat_fields
from ppx.launch.watchdog import read_status

LONG_RUN = (
    "model.kind=synthetic",
    "model.hidden=16",
    "model.fwd_ms=20",
    "model.bwd_ms=20",
    "train.steps=1000",
    "runtime.device=cpu",
    "logging.wandb.mode=disabled",
    "logging.report=false",
)

# where rank 0 of 1f1b_2cpu (p=2, m=4) can be when rank 1 dies on 1B1 (runtime.inject_fault=
# die@1B1): waiting on rank 1's gradient B0 or B1 (which, the killed send's timing decides), or,
# on a loaded machine that has not yet brought it there when its launcher's SIGTERM comes, on an
# item between (the post that sent F1, 0B0, 0F2, the post that sends F2), or just after one
RANK0_UNTIL_B1 = r"(0SEND_F1( 0RECV_B\d)*|wait 0RECV_B[01] from rank 1|(after )?(0B0|0F2)|0SEND_F2)"


def start_run(experiment: str, run_dir, tmp_path, *overrides: str) -> tuple[subprocess.Popen, object]:
    """``ppx run`` in the background (its output to a file: a pipe nobody reads would fill)."""
    log = open(tmp_path / "ppx.log", "w+")
    cmd = [sys.executable, "-m", "ppx.cli", "run", experiment, *LONG_RUN, *overrides, f"run.dir={run_dir}"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True), log


def wait_for_step(run_dir, world: int, step: int = 1, timeout: float = 150) -> None:
    """Until every rank's status line is at ``step`` or later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [read_status(run_dir / "status" / f"rank{r}.txt") for r in range(world)]
        steps = [re.search(r"\(step (\d+)\)", line) for line in lines]
        if all(m and int(m.group(1)) >= step for m in steps):
            return
        time.sleep(0.2)
    raise AssertionError(f"the ranks never reached step {step}: {lines}")


def read_log(log) -> str:
    log.seek(0)
    return log.read()


def parent_pid(pid: int | str) -> int | None:
    """Process ``pid``'s parent's pid from /proc (`ppx.launch.processes.stat_fields`), or None if gone."""
    fields = stat_fields(int(pid))
    return int(fields[1]) if fields else None


def process_state(pid: int | str) -> str:
    """Process ``pid``'s state letter from /proc ("Z": ended, not yet reaped), or "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def workers(run_dir, launcher: bool = False) -> list[int]:
    """The live processes of this run's job (torchrun and its workers; ``launcher``: its ``ppx
    run`` too), from /proc."""
    pids = []
    for name in os.listdir("/proc"):
        try:
            cmdline = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        named = str(run_dir).encode() in cmdline or (launcher and f"run.dir={run_dir}".encode() in cmdline)
        if named and (launcher or b"ppx.cli" not in cmdline) and process_state(name) not in ("Z", "gone"):
            pids.append(int(name))
    return pids


def signal_mid_run(proc: subprocess.Popen, run_dir, world: int, send, timeout: float) -> tuple[float, list[int]]:
    """Once every rank is at ``world``'s step (`wait_for_step`), ``send()`` a signal and wait
    for ``ppx run`` to end: (seconds from the signal to its end, the job's processes left).
    Whatever happens, nothing is left running (`end`)."""
    try:
        wait_for_step(run_dir, world)
        send()
        sent = time.monotonic()
        proc.wait(timeout=timeout)
        return time.monotonic() - sent, workers(run_dir)
    finally:
        end(proc, run_dir)


def end(proc: subprocess.Popen, run_dir) -> None:
    """A failed test leaves nothing running either."""
    for pid in [*workers(run_dir), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
