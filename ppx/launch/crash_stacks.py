"""Python's stacks at a crash (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL: `faulthandler`) go to
``<run>/status/rank<r>.stacks``, not to the job's output: torch's error handler enables
faulthandler on stderr, where a crashed rank's 70-odd lines (every thread's stack, the
extension modules) came before the one line that names the rank. That line names the file."""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

from ppx.launch.watchdog import launcher_alive

_OPEN: list = []  # the file faulthandler writes to stays open for the process's life


def stacks_path(status_dir: Path, rank: int) -> Path:
    return Path(status_dir) / f"rank{rank}.stacks"


def stacks_to_file(status_dir: Path, rank: int) -> None:
    """From now on, a crash's stacks go to ``stacks_path``, where a launcher names the file:
    a rank of ``ppx run`` (not its own process: a rank run in it dies with it) or of ppx's
    torchrun under srun. Elsewhere, where asked for (``python -X faulthandler``,
    PYTHONFAULTHANDLER) or where the file cannot be opened, they stay where they were."""
    named = launcher_alive() or os.environ.get("PPX_RUN_DIR")  # (as the SIGTERM-following thread asks)
    if not named or "faulthandler" in sys._xoptions or os.environ.get("PYTHONFAULTHANDLER"):
        return
    try:
        f = open(stacks_path(status_dir, rank), "w")
    except OSError:
        return
    _OPEN.append(f)
    faulthandler.enable(file=f, all_threads=True)


def stacks_note(status_dir: Path, rank: int) -> str:
    """ "; Python's stacks at the crash: <file>" where the rank's crash wrote any, else ""."""
    path = stacks_path(status_dir, rank)
    try:
        return f"; Python's stacks at the crash: {path}" if path.stat().st_size else ""
    except OSError:
        return ""
