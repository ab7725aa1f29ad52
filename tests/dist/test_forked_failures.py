"""torchrun's forked ranks (`ppx.launch.torchrun`, CPU runs): every failed rank's exit code
reaches the launcher, not only the first one torch's MultiprocessContext saw (real forked
processes through torch's own start_processes)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

from helpers.job import process_state
from ppx.launch.torchrun import _report_every_failed_fork



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
