"""`ppx plan --calibrate`: this machine's runtime figures (overhead per action, hand-off and
posting times) measured by ppx itself, once, with the short known-cost run a plan from flags
points to, and kept in the user's cache for the next plans at the same p.

The runs live in ``<cache>/calibration/<host>/p<p>/<UTC time>`` (``<cache>``: ``$PPX_CACHE_DIR``,
else ``$XDG_CACHE_HOME/ppx``, else ``~/.cache/ppx``); ``--calibrate`` takes the newest completed
one, ``--calibrate new`` measures again into a new folder. Nothing is overwritten."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from ppx.config import SUMMARY_ONLY, as_overrides
from ppx.errors import UserError


def cache_root() -> Path:
    """Where ppx keeps what it measures of this machine (an absolute path)."""
    if os.environ.get("PPX_CACHE_DIR"):
        return Path(os.environ["PPX_CACHE_DIR"]).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(base).expanduser() / "ppx").resolve()


def host() -> str:
    """This host's name as one folder name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()).strip(".") or "unknown"


def folder(p: int) -> Path:
    """This host's calibrations at ``p`` ranks."""
    return cache_root() / "calibration" / host() / f"p{p}"


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
    whether it was measured now. Runs ``ppx run`` (torchrun, gloo on CPU) on the shipped
    experiment when there is none; Ctrl-C ends it as it ends any ``ppx run``."""
    from ppx.paths import shipped
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
    experiment = shipped("experiments") / f"{words[0]}.yaml"  # not a same-named file of the user's
    cmd = [sys.executable, "-m", "ppx.cli", "run", str(experiment), *words[1:], f"run.dir={run_dir}"]
    quiet = as_overrides(SUMMARY_ONLY)  # only its summary.json is read
    proc = subprocess.Popen([*cmd, *quiet], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate()
    except KeyboardInterrupt:  # the run got the SIGINT too: let it end its ranks
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()
        raise
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        why = next((x for x in reversed(lines) if x.startswith("ppx: error: ")), lines[-1] if lines else "no output")
        where = f"; see {run_dir}" if run_dir.exists() else ""
        raise UserError(f"--calibrate: the calibration run failed: {why.removeprefix('ppx: error: ')}{where}")
    return run_dir, True


def measured_at(run_dir: Path) -> str:
    """When a calibration ran (its folder's UTC time), for the plan's header."""
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.strptime(run_dir.name, "%Y%m%d-%H%M%S"))
    except ValueError:
        return run_dir.name
