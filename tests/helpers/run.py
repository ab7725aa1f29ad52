"""Run the real ``ppx`` command in a subprocess, find free ports, read a run's JSON files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"  # schedule CSVs the tests read


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ppx(*args: str, timeout: float = 240, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``python -m ppx.cli <args>`` as a user would, and capture its output. A ``ppx run``
    that does not name ``logging.wandb.mode`` runs without W&B (about 2 s a run); the tests
    of W&B name the mode, the default (offline) included."""
    if args[:1] == ("run",) and not any(a.startswith("logging.wandb.mode=") for a in args):
        args = (*args, "logging.wandb.mode=disabled")
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "ppx.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
