"""Per-rank watchdog: ends the job when one rank makes no progress for ``timeout_s``.

It follows what the rank is doing (every program item, plus phases such as the optimizer
step), writes it to ``<run>/status/rank<r>.txt`` when it changes (so the launcher can name
the action a dead rank was on) and, past the timeout, prints one line naming the rank and
the action and exits the process, which makes torchrun end the other ranks.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional

EXIT_TIMEOUT = 3


class Watchdog:
    def __init__(self, rank: int, timeout_s: float, status_dir: Optional[Path] = None, poll_s: float = 0.2):
        self.rank, self.timeout_s, self.poll_s = rank, timeout_s, poll_s
        self.status_file = Path(status_dir) / f"rank{rank}.txt" if status_dir else None
        self.step = -1
        self.label = "starting"
        self.since = time.monotonic()
        self._written: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ppx-watchdog", daemon=True)

    # observer interface
    def before(self, item) -> None:
        self.label = item.label
        self.since = time.monotonic()

    def after(self, item) -> None:
        pass

    def phase(self, label: str, step: Optional[int] = None) -> None:
        if step is not None:
            self.step = step
        self.label = label
        self.since = time.monotonic()

    def where(self) -> str:
        return f"{self.label} (step {self.step})" if self.step >= 0 else self.label

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def flush(self) -> None:
        """Write the current status now (the thread writes it every ``poll_s`` otherwise)."""
        self._written = None
        self._write_status()

    def _write_status(self) -> None:
        where = self.where()
        if self.status_file is None or where == self._written:
            return
        try:
            tmp = self.status_file.with_suffix(".tmp")
            tmp.write_text(where + "\n")
            os.replace(tmp, self.status_file)
            self._written = where
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._write_status()
            where = self.where()
            stalled = time.monotonic() - self.since
            if stalled > self.timeout_s:
                sys.stderr.write(
                    f"ppx: error: rank {self.rank} made no progress for {stalled:.1f} s on {where}; "
                    f"ending the job (runtime.timeout_s={self.timeout_s:g})\n"
                )
                sys.stderr.flush()
                os._exit(EXIT_TIMEOUT)
