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

# Every run a test starts is a CPU + gloo run, whatever GPUs this machine has (experiments
# default to runtime.device=auto, which takes the GPUs when there are enough): the tests check
# the CPU path, and several ranks of one job on one GPU would abort NCCL. GPUs are counted
# before they are hidden from the processes tests start; tests that need them pass GPU_ENV.
import torch  # noqa: E402

CUDA_DEVICES = torch.cuda.device_count()
_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
GPU_ENV = {"CUDA_VISIBLE_DEVICES": _visible if _visible is not None else ",".join(map(str, range(CUDA_DEVICES)))}
os.environ["CUDA_VISIBLE_DEVICES"] = ""


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
