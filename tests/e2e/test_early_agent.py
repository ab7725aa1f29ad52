"""A user's ``ppx run`` starts torchrun's agent server as it starts (ppx/launch/early_agent.py):
the CPU job's agent is forked there, once the config is checked, from a process that imported
torch beside the checks; a job whose ranks are started, or a config refused, ends the server;
nothing of it is left, not even a folder of a ``ppx run`` killed before its job began."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import ppx
from helpers.job import end, start_run, workers
from ppx.launch.early_agent import PREFIX, EarlyAgent

pytestmark = pytest.mark.plain_agent  # a user's run: no server of the test suite's (tests/conftest.py)


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, command line) of ``pid``, None where it is gone."""
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return parent, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, IndexError, ValueError):
        return None


def _agents_parent(proc: subprocess.Popen, run_dir) -> tuple[str, int] | None:
    """The command line of the parent of the job's torchrun agent, and that one's parent,
    once the agent is seen; None where the run ended first."""
    while proc.poll() is None:
        job = workers(run_dir)
        for pid in job:
            seen = _stat(pid)
            if seen is not None and seen[0] not in job and "ppx.launch.torchrun" in seen[1]:
                above = _stat(seen[0])
                return (above[1], above[0]) if above else None
        time.sleep(0.02)
    return None


def _folders(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{PREFIX}{pid}-*"))


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "started"])
def test_the_agent_comes_from_the_server_the_run_started(run_dir, tmp_path, fork):
    """Forked ranks: the agent's parent is an agent server, whose parent is ``ppx run``.
    Started ranks (as a GPU's are): the server has been ended, the agent is ``ppx run``'s own
    child. Either way the run completes, and no server process nor folder is left."""
    proc, _ = start_run("1f1b_2cpu", run_dir, tmp_path, "train.steps=4", f"runtime.fork_ranks={str(fork).lower()}")
    try:
        parent = _agents_parent(proc, run_dir)
        assert parent is not None, "no torchrun agent seen"
        line, grandparent = parent
        if fork:
            assert "ppx.launch.agent_server" in line and grandparent == proc.pid, parent
        else:
            assert "ppx.cli run" in line, parent
            assert [p for p in _children(proc.pid) if "agent_server" in (_stat(p) or (0, ""))[1]] == []
        assert proc.wait(timeout=180) == 0
    finally:
        end(proc, run_dir)
    assert (run_dir / "summary.json").exists()
    assert _folders(proc.pid) == []


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_refused_config_ends_its_server_and_a_dead_runs_folder_goes(tmp_path):
    """A key the schema lacks: one line, exit 2, no server left, no folder; the folder a
    ``ppx run`` killed before its job left (its pid dead) is removed by the next run."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{dead.pid}-", dir=tmp_path))
    (stale / "socket").touch()
    alive = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=tmp_path))
    r = ppx("run", "1f1b_2cpu", "model.hiden=3", env={"TMPDIR": str(tmp_path)}, timeout=60)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("ppx: error: model.hiden: Key 'hiden' not in 'ModelConfig'"), r.stderr
    assert list(tmp_path.iterdir()) == [alive]
    out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert out.stdout.split() == [], "an agent server was left"


def test_a_hugging_face_run_has_its_server_import_transformers():
    """The server imports transformers' model classes where the run's model.kind reads as hf
    (its agent would otherwise import them after the checks), and only there."""
    pytest.importorskip("transformers")
    for experiment, overrides, preload in [
        ("hf_llama_tiny_1f1b_2cpu", [], "transformers"),
        ("llama_tiny_1f1b_2cpu", [], "-"),
        ("1f1b_2cpu", ["model.kind=hf", "model.hf_config=gpt2"], "transformers"),
    ]:
        agent = EarlyAgent.start(experiment, overrides)
        try:
            assert agent is not None and agent.proc.args[6] == preload, (experiment, agent and agent.proc.args)
        finally:
            agent.stop()
        assert not agent.folder.exists()
