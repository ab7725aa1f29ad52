"""Per-rank watchdog: ends the job when one rank makes no progress for ``timeout_s``.

It follows what the rank is doing (every program item, plus phases such as the optimizer
step) and mirrors it into ``<run>/status/rank<r>.txt`` through a shared memory map, so the
file names the exact action even when the process is killed (the launcher reads it to
explain a failed job). Past the timeout it prints one line naming the rank and the action
and exits the process, which makes torchrun end the other ranks.

On a GPU the host queues a step ahead of the device and then waits at the step's end, so
the watchdog also follows ``device_position`` (the first action the GPU has not finished,
from the CUDA timer's events) when it is set: the GPU moving on counts as progress, and a
hang names the action the GPU is stuck on.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

EXIT_TIMEOUT = 3
STATUS_BYTES = 512


def _status_line(text: bytes) -> bytes:
    """A status file's fixed-size content: one text line, padded with spaces (grep and cat
    read it as text; the mapping never changes size)."""
    return text[: STATUS_BYTES - 1].ljust(STATUS_BYTES - 1, b" ") + b"\n"


def read_status(path: Path) -> str:
    """The text a watchdog left in a status file ('' if none)."""
    try:
        return path.read_bytes().rstrip(b"\0 \n").decode(errors="replace")
    except OSError:
        return ""


class Watchdog:
    def __init__(self, rank: int, timeout_s: float, status_dir: Path | None = None, poll_s: float = 0.1):
        self.rank, self.timeout_s, self.poll_s = rank, timeout_s, poll_s
        self.grace_s = max(1.0, 0.25 * timeout_s)
        self.limit_s = timeout_s
        self.step = -1
        self.label = "starting"
        self.since = time.monotonic()
        self._map = None
        if status_dir is not None:
            status_dir = Path(status_dir)
            status_dir.mkdir(parents=True, exist_ok=True)
            with open(status_dir / f"rank{rank}.txt", "w+b") as f:
                f.write(_status_line(b"starting"))
                f.flush()
                self._map = mmap.mmap(f.fileno(), STATUS_BYTES)
        self.device_position: Callable[[], str | None] | None = None
        self._device_at: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ppx-watchdog", daemon=True)

    # observer interface: called around every program item
    def before(self, item) -> None:
        self.limit_s = self.timeout_s if item.kind == "compute" else self.timeout_s + self.grace_s
        self._set(item.label)

    def after(self, item) -> None:
        pass

    def phase(self, label: str, step: int | None = None) -> None:
        """Record a phase outside the action list (barrier, optimizer step, ...)."""
        if step is not None:
            self.step = step
        self.limit_s = self.timeout_s + self.grace_s  # phases wait on other ranks
        self._set(label)

    def where(self) -> str:
        where = f"{self.label} (step {self.step})" if self.step >= 0 else self.label
        return f"{where}; the GPU is on {self._device_at}" if self._device_at else where

    def _set(self, label: str) -> None:
        self.label = label
        self.since = time.monotonic()
        self._mirror()

    def _mirror(self) -> None:
        if self._map is not None:
            self._map[:] = _status_line(self.where().encode())

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.device_position is not None:
                at = self.device_position()
                if at != self._device_at:  # the device moved on: progress, even while the host waits
                    self._device_at = at
                    self.since = time.monotonic()
                    self._mirror()
            stalled = time.monotonic() - self.since
            if stalled > self.limit_s:
                sys.stderr.write(
                    f"ppx: error: rank {self.rank} made no progress for {stalled:.1f} s on {self.where()}; "
                    f"ending the job (runtime.timeout_s={self.timeout_s:g})\n"
                )
                sys.stderr.flush()
                os._exit(EXIT_TIMEOUT)
