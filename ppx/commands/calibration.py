"""`ppx plan --calibrate`: this machine's runtime figures (overhead per action, hand-off and
posting times) measured by ppx itself, once, with the short known-cost run a plan from flags
points to, and kept in the user's cache for the next plans at the same p.

The runs live in ``<cache>/calibration/<host>/p<p>/<UTC time>`` (``<cache>``: ``$PPX_CACHE_DIR``,
else ``$XDG_CACHE_HOME/ppx``, else ``~/.cache/ppx``); ``--calibrate`` takes the newest completed
one, ``--calibrate new`` measures again into a new folder. Nothing is overwritten."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from ppx.errors import UserError

MAX_RANKS = 8  # a calibration runs p CPU ranks on this machine: more is a cluster's p


def cache_root() -> Path:
    """Where ppx keeps what it measures of this machine."""
    if os.environ.get("PPX_CACHE_DIR"):
        return Path(os.environ["PPX_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ppx"


def folder(p: int) -> Path:
    """This host's calibrations at ``p`` ranks."""
    return cache_root() / "calibration" / socket.gethostname() / f"p{p}"


def completed(p: int) -> Path | None:
    """The newest completed calibration run at ``p`` ranks on this host, or None."""
    runs = sorted(folder(p).glob("*/summary.json")) if folder(p).is_dir() else []
    for summary in reversed(runs):
        try:
            if json.loads(summary.read_text()).get("status") == "completed":
                return summary.parent
        except (OSError, ValueError):
            continue
    return None


def calibrated_run(p: int, mode: str) -> tuple[Path, bool]:
    """A calibration run directory at ``p`` ranks (``mode``: "reuse" the newest, or "new"), and
    whether it was measured now. Runs ``ppx run`` (torchrun, gloo on CPU) when there is none."""
    from ppx.plan.calibrate import calibration_command

    if mode == "reuse":
        found = completed(p)
        if found is not None:
            return found, False
    run_dir = folder(p) / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    if run_dir.exists():
        raise UserError(f"--calibrate: {run_dir} exists; try again in a second")
    words = calibration_command(p).split()[2:]
    print(f"ppx plan: calibrating this machine: ppx run {' '.join(words)} run.dir={run_dir}", flush=True)
    cmd = [sys.executable, "-m", "ppx.cli", "run", *words, f"run.dir={run_dir}", "logging.wandb.mode=disabled"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"--calibrate: the calibration run failed ({tail}); see {run_dir}")
    return run_dir, True


def measured_at(run_dir: Path) -> str:
    """When a calibration ran (its folder's UTC time), for the plan's header."""
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.strptime(run_dir.name, "%Y%m%d-%H%M%S"))
    except ValueError:
        return run_dir.name
