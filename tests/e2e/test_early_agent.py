"""A user's ``ppx run`` starts torchrun's agent server as it starts (ppx/launch/early_agent.py):
the CPU job's agent is forked there, once the config is checked, from a process that imported
torch beside the checks; a job whose ranks are started, a config refused, or a run the server
would refuse ends it or starts none; nothing of it is left, a ``ppx run`` killed included."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import REPO, ppx
from helpers.job import end, parent_pid, process_state, workers
from ppx.launch.devices import CPU_ONLY
from ppx.launch.early_agent import EarlyAgent
from ppx.launch.processes import FORK
from ppx.launch.served_agent import AGENT_MODULE, ServedAgent

pytestmark = [
    pytest.mark.plain_agent,  # a user's run: no server of the test suite's (tests/conftest.py)
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: ppx run starts no early server"),
]


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, command line) of ``pid``, None where it is gone."""
    parent = parent_pid(pid)
    if parent is None:
        return None
    try:
        return parent, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
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


@pytest.fixture
def short_tmp():
    """A TMPDIR of a short path, where the server's folder goes: a socket's path holds at most
    108 bytes, and under pytest's own folders (xdist's) it would go to /tmp instead."""
    folder = Path(tempfile.mkdtemp(prefix="ppx-ea-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _servers(folder: Path) -> list[int]:
    """Live agent servers whose socket lies in ``folder``, from /proc."""
    found = []
    for proc in Path("/proc").iterdir():
        seen = _stat(int(proc.name)) if proc.name.isdigit() else None
        if seen is not None and f"ppx.launch.agent_server {folder}" in seen[1] and process_state(proc.name) != "Z":
            found.append(int(proc.name))
    return found


@pytest.mark.parametrize(
    "keys,served",
    [([], True), (["runtime.fork_ranks=false"], False), (["runtime.early_agent=false"], False)],
    ids=["forked", "started_ranks", "turned_off"],
)
def test_the_agent_comes_from_the_server_the_run_started(run_dir, short_tmp, keys, served):
    """Forked ranks: the agent's parent is an agent server, whose parent is ``ppx run``.
    Started ranks (as a GPU's are), or runtime.early_agent=false: the agent is ``ppx run``'s own
    child. Either way the run completes, and no server nor its folder is left."""
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    cmd = [sys.executable, "-m", "ppx.cli", "run", "1f1b_2cpu", "train.steps=4", *keys, f"run.dir={run_dir}"]
    cmd += ["logging.wandb.mode=disabled", "logging.report=false"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        parent = _agents_parent(proc, run_dir)
        assert parent is not None, "no torchrun agent seen"
        line, grandparent = parent
        if served:
            assert "ppx.launch.agent_server" in line and grandparent == proc.pid, parent
        else:
            assert "ppx.cli run" in line, parent
            assert _servers(short_tmp) == []
        assert proc.wait(timeout=180) == 0
    finally:
        end(proc, run_dir)
    assert (run_dir / "summary.json").exists()
    assert list(short_tmp.glob("ppx-agent-*")) == [] and _servers(short_tmp) == []


def test_a_refused_config_ends_its_server_and_a_killed_run_leaves_no_folder(short_tmp, tmp_path):
    """A key the schema lacks: one line, exit 2, no server left, no folder. A ``ppx run`` killed
    (SIGKILL) once its server listens: the server ends and removes its folder itself."""
    env = {"TMPDIR": str(short_tmp)}
    r = ppx("run", "1f1b_2cpu", "model.hiden=3", env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("ppx: error: model.hiden: Key 'hiden' not in 'ModelConfig'"), r.stderr
    assert list(short_tmp.iterdir()) == [] and _servers(short_tmp) == []
    cmd = [sys.executable, "-m", "ppx.cli", "run", "1f1b_2cpu", "train.steps=200", f"run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(short_tmp.glob("ppx-agent-*/socket")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(short_tmp.glob("ppx-agent-*/socket")), "no server listened"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while (list(short_tmp.glob("ppx-agent-*")) or _servers(short_tmp)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(short_tmp.glob("ppx-agent-*")) == [] and _servers(short_tmp) == []
    finally:
        end(proc, tmp_path / "run")


def test_a_hugging_face_run_has_its_server_import_transformers_and_a_refused_one_starts_none():
    """The server imports transformers' model classes where the run's model.kind reads as hf
    (its agent would otherwise import them after the checks), and only there; a run the server
    would refuse (another thread count: read as torch is imported) starts none."""
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
    assert EarlyAgent.start("1f1b_2cpu", ["runtime.threads_per_rank=2"]) is None


def test_a_request_the_server_refuses_is_said_and_a_fallbacks_threads_start_none(tmp_path):
    """A request the server cannot serve (a thread count other than the one it imported with)
    gets a plain agent, and ``ppx run`` says so in one line (`EarlyAgent.refused`); an
    experiment whose runtime.cpu_fallback sets another thread count starts no server."""
    agent = EarlyAgent.start("1f1b_2cpu", [])
    assert agent is not None
    try:
        server = agent.listening()
        env = dict(os.environ, **CPU_ONLY, OMP_NUM_THREADS="3")
        assert ServedAgent.request(server, [sys.executable, "-m", AGENT_MODULE, FORK, "--help"], env) is None
        assert agent.refused() == (
            "ppx: note: the agent imported while the config was checked did not serve this run (OMP_NUM_THREADS "
            "not as the server's imports read); runtime.early_agent=false starts none"
        )
    finally:
        agent.stop()
    exp = tmp_path / "fallback.yaml"
    exp.write_text("runtime:\n  device: auto\n  cpu_fallback: [runtime.threads_per_rank=2]\n")
    assert EarlyAgent.start(str(exp), []) is None
