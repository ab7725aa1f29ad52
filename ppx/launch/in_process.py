"""One rank run inside ``ppx run`` itself (a GPU's single rank: a process that has started
CUDA cannot fork, and a job of its own would import torch and start CUDA a second time).
Stopped by a stop signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2: `ppx.launch.stops`), it ends as a watched job does (`ppx.launch.supervisor`):
one line, ``incomplete.txt`` saying where the rank was, exit code 128 + the signal (the
process ends there, ``os._exit``: a stop ends ``ppx run``). A hang
still ends it through its watchdog; a SIGKILL, which no process can catch, says nothing."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from ppx.launch.stops import STOP_SIGNALS, stops_handled, take
from ppx.launch.supervisor import report_stop, where


class Stopped(BaseException):
    """A stop signal, raised in the main thread (past every ``except Exception`` of the run)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise(signum, frame) -> None:
    for s in STOP_SIGNALS:  # one stop: a second signal must not interrupt the ending
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


def run_in_process(cfg, run_dir: Path, device: str, early=()) -> int:
    """``run_rank`` of rank 0 of a one-rank job here; its exit code (``early``: stop signals
    received before, `stops.stops_held`'s)."""
    from ppx.launch.worker import run_rank

    with stops_handled(_raise):
        started = time.monotonic()
        try:
            if early:
                _raise(take(early), None)
            return run_rank(cfg, run_dir, device)
        except Stopped as e:
            states = f"where each rank was: rank 0: {where(run_dir / 'status', 0)}"
            complete = (run_dir / "summary.json").exists()
            code = report_stop(run_dir, e.signum, time.monotonic() - started, states, complete)
            # said and written: end here, as a forked rank does (ppx.launch.worker), not through the
            # interpreter's finalization, where the interrupted job's gloo threads, never joined, can
            # abort the process (exit -6, "terminate called without an active exception")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
