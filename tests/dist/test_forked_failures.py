"""torchrun's forked ranks (`ppx.launch.torchrun`, CPU runs): every failed rank's exit code
reaches the launcher, not only the first one torch's MultiprocessContext saw (real forked
processes through torch's own start_processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

from helpers.job import process_state
from ppx.launch.torchrun import FAILED_GRACE_S, _report_every_failed_fork



def _rank(how: str) -> None:
    if how == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def _failures(tmp_path) -> dict[int, int]:
    ctx = start_processes(
        "ranks",
        _rank,
        args={0: ("exit",), 1: ("kill",)},
        envs={0: {}, 1: {}},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)),
        start_method="fork",
    )
    deadline = time.monotonic() + 30
    # both ranks over before torch's first look, as when they fail together: no race between
    # its polls and the ranks (torch's own poll then reports one of them, whichever it finds first)
    while not all(process_state(pid) in ("Z", "gone") for pid in ctx.pids().values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    while (result := ctx.wait(0.2)) is None and time.monotonic() < deadline:
        pass
    ctx.close()
    assert result is not None, "the ranks never ended"
    return {rank: f.exitcode for rank, f in result.failures.items()}


def test_every_failed_fork_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(MultiprocessContext, "_poll", MultiprocessContext._poll)  # restored after the test
    _report_every_failed_fork()
    assert _failures(tmp_path) == {0: 3, 1: -signal.SIGKILL}


def _exits_after(seconds: float, code: int) -> None:
    time.sleep(seconds)
    sys.exit(code)


def _held_failure(tmp_path, survivor_s: float) -> tuple[dict[int, int], float]:
    """Rank 1 exits with 3 at once, rank 0 with 4 after ``survivor_s``: the exit codes torchrun
    reports, and how long after rank 1 was seen ended it reported them (seconds)."""
    ctx = start_processes(
        "ranks",
        _exits_after,
        args={0: (survivor_s, 4), 1: (0.0, 3)},
        envs={0: {}, 1: {}},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)),
        start_method="fork",
    )
    deadline = time.monotonic() + 30
    while process_state(ctx.pids()[1]) not in ("Z", "gone") and time.monotonic() < deadline:
        time.sleep(0.01)
    ended = time.monotonic()
    while (result := ctx.wait(0.02)) is None and time.monotonic() < deadline:
        pass
    reported = time.monotonic() - ended
    ctx.close()
    assert result is not None, "the ranks never ended"
    return {rank: f.exitcode for rank, f in result.failures.items()}, reported


def test_a_failure_is_held_back_for_the_survivors_grace(tmp_path, monkeypatch):
    """torchrun looks every 0.1 s at forked ranks (`torchrun_command`): a failed rank's survivors
    still get FAILED_GRACE_S to end on their own (to name the dead peer) before its SIGTERM."""
    monkeypatch.setattr(MultiprocessContext, "_poll", MultiprocessContext._poll)
    _report_every_failed_fork()
    codes, reported = _held_failure(tmp_path / "quick", survivor_s=0.1)
    assert codes == {0: 4, 1: 3}  # the survivor ended on its own, not by torchrun's SIGTERM
    codes, reported = _held_failure(tmp_path / "slow", survivor_s=60.0)
    # ended by torchrun (its SIGTERM, which torch's fork wrapper turns into exit code 1), after the grace
    assert codes[1] == 3 and codes[0] != 4 and FAILED_GRACE_S <= reported < 10, (codes, reported)


def test_the_agent_freezes_what_it_imported_for_its_forks():
    """What torchrun's agent imported for its forked ranks is out of the collector's walks
    (gc.freeze): a rank's first collection walks only its own objects, not torch's again."""
    code = "import gc; from ppx.launch.torchrun import _import_for_the_workers as f; f(); print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 100_000, out.stdout  # (torch and torch._dynamo: about 300,000 objects)
