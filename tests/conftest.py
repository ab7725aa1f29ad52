"""Shared helpers: run the real ``ppx`` command in a subprocess, find free ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ppx(*args: str, timeout: float = 240, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``python -m ppx.cli <args>`` as a user would, and capture its output."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "ppx.cli", *args], cwd=cwd, env=full_env,
        capture_output=True, text=True, timeout=timeout,
    )


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run directory path that does not exist yet."""
    return tmp_path / "run"
