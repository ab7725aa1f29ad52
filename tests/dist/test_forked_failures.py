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

from ppx.launch.torchrun import _report_every_failed_fork

pytestmark = pytest.mark.timing  # which rank torch's first poll finds dead is a race with the ranks


def _rank(how: str) -> None:
    if how == "exit":
        time.sleep(0.3)  # after the other has died: both are over at torchrun's next look
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
    while (result := ctx.wait(0.2)) is None and time.monotonic() < deadline:
        pass
    ctx.close()
    assert result is not None, "the ranks never ended"
    return {rank: f.exitcode for rank, f in result.failures.items()}


def test_every_failed_fork_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(MultiprocessContext, "_poll", MultiprocessContext._poll)  # restored after the test
    _report_every_failed_fork()
    assert _failures(tmp_path) == {0: 3, 1: -signal.SIGKILL}
