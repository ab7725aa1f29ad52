"""The suite's agent server (ppx/launch/agent_server.py) forks torchrun's agent as ``ppx run``
would start it: the same run (a model from PYTHONPATH, the same losses), output line by line as
it comes, processes the launcher finds by their command lines (a frozen rank named), nothing left
running when ``ppx run`` is killed; a request it cannot serve gets a plain agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# as in a test process that imported them before (tests/dist's): torch._dynamo's import sets
# TORCHINDUCTOR_CACHE_DIR, which every ppx run then hands on, and the server must take
import torch._dynamo  # noqa: E402, F401

import ppx as ppx_package
from helpers import ppx, read_jsonl
from helpers.job import end, parent_pid, read_log, start_run, wait_for_step, workers
from ppx.launch.agent_server import refused_path, wait_for
from ppx.launch.processes import FORK
from ppx.launch.served_agent import AGENT_MODULE, SERVER_ENV, ServedAgent, start_agent
from ppx.models.hf_config import IMPORT_SETTINGS

pytestmark = pytest.mark.plain_agent  # (a run served only where a test says so)

MODEL = """
from torch import nn


def tanh_mlp(model):
    return nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)))
"""


@pytest.fixture
def server(request):
    """This test process's server (tests/conftest.py): (its socket, its process)."""
    proc, folder = request.config._ppx_agent_server
    wait_for(folder / "socket")
    return folder / "socket", proc


def test_a_served_run_is_the_plain_runs_run(server, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tanh_models.py").write_text(MODEL)
    args = ["run", "1f1b_2cpu", "model.kind=module", "model.module=tanh_models:tanh_mlp", "model.data=regression"]
    args += ["model.hidden=16", "train.steps=3"]
    env = {"PYTHONPATH": str(tmp_path / "models")}
    plain = ppx(*args, "runtime.early_agent=false", f"run.dir={tmp_path / 'plain'}", env=env)  # (a new process)
    served = ppx(*args, f"run.dir={tmp_path / 'served'}", env={**env, SERVER_ENV: str(server[0])})
    assert plain.returncode == 0 and served.returncode == 0, plain.stderr[-3000:] + served.stderr[-3000:]
    losses = [[m["loss"] for m in read_jsonl(tmp_path / d / "metrics.jsonl")] for d in ("plain", "served")]
    assert losses[0] == losses[1] and len(losses[0]) == 3
    lines = [[" ".join(line.split()[:2]) for line in r.stdout.splitlines()] for r in (plain, served)]
    assert lines[0] == lines[1] and lines[0][:3] == ["[1f1b_2cpu] step"] * 3, lines


def test_a_served_agents_processes_are_found_and_a_frozen_rank_named(server, tmp_path, monkeypatch):
    """The agent is the server's child, its command line (and its forked ranks') the one ``ppx
    run`` asked for; rank 1 stopped is named after runtime.timeout_s, as a plain agent's is."""
    monkeypatch.setenv(SERVER_ENV, str(server[0]))
    run_dir = tmp_path / "run"
    proc, log = start_run("1f1b_2cpu", run_dir, tmp_path, "runtime.timeout_s=3")
    try:
        wait_for_step(run_dir, 2, step=3)
        job = workers(run_dir)
        agents = [pid for pid in job if parent_pid(pid) == server[1].pid]
        assert len(agents) == 1 and len(job) == 3, (job, agents)
        assert "step 0 " in read_log(log)  # (rank 0's lines come as they are printed)
        os.kill(next(pid for pid in job if pid not in agents), signal.SIGSTOP)  # (a rank)
        proc.wait(timeout=60)
        out = read_log(log)
        assert proc.returncode == 1 and "stopped responding (no heartbeat for" in out, out[-3000:]
        assert not workers(run_dir)
    finally:
        end(proc, run_dir)


def test_a_killed_ppx_run_leaves_no_served_job(server, tmp_path, monkeypatch):
    """A kill -9 of ``ppx run``: the server SIGTERMs the agent, as its PR_SET_PDEATHSIG would."""
    monkeypatch.setenv(SERVER_ENV, str(server[0]))
    run_dir = tmp_path / "run"
    proc, _ = start_run("1f1b_2cpu", run_dir, tmp_path)
    try:
        wait_for_step(run_dir, 2)
        assert any(parent_pid(pid) == server[1].pid for pid in workers(run_dir))
        proc.kill()
        deadline = time.monotonic() + 15
        while workers(run_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not workers(run_dir)
    finally:
        end(proc, run_dir)


def test_what_a_server_cannot_serve_gets_a_plain_agent(server, monkeypatch):
    """Another command, no server there, a variable torch reads as it is imported set otherwise,
    another ppx: no agent served (a plain one started instead)."""
    noted = refused_path(server[0])  # (each refusal a line there, for the suite's summary: tests/conftest.py)
    before = noted.stat().st_size if noted.exists() else 0
    try:
        _refusals(server, monkeypatch, noted)
    finally:  # (this test's own refusals are no run's fallback: left out of the summary)
        if noted.exists():
            os.truncate(noted, before)


def _refusals(server, monkeypatch, noted: Path) -> None:
    agent = [sys.executable, "-m", "ppx.launch.torchrun", FORK, "--help"]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # (a run's, as the server's)
    served = ServedAgent.request(str(server[0]), agent, env)
    assert served is not None and served.wait(timeout=60) == 0  # (torchrun's help, from the server)
    quiet = {**env, **IMPORT_SETTINGS}  # (a model.kind=hf run's: transformers' settings as ppx sets them)
    served = ServedAgent.request(str(server[0]), agent, quiet)
    assert served is not None and served.wait(timeout=60) == 0
    assert isinstance(start_agent([sys.executable, "-c", "pass"], {}, str(server[0])), subprocess.Popen)
    assert ServedAgent.request(str(server[0].with_name("none")), agent, env) is None
    hashed = {**env, "PYTHONHASHSEED": "7"}  # (read as torch was imported: the server's is not)
    assert ServedAgent.request(str(server[0]), agent, hashed) is None
    lines = noted.read_text().splitlines()  # (noted before the answer)
    assert lines[-1] == "PYTHONHASHSEED not as the server's imports read\t" + " ".join(agent), lines
    monkeypatch.setattr(ppx_package, "__file__", "/elsewhere/ppx/__init__.py")  # another ppx's run
    assert ServedAgent.request(str(server[0]), agent, env) is None


def test_a_server_ends_with_its_starter_and_one_whose_starter_has_gone_never_listens(tmp_path):
    """The server follows the pid its starter gave: it ends when that process dies, and at once
    where it has gone already (it had followed getppid(), which names init once the starter is
    gone: a server started so served on forever)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    command = [
        sys.executable,
        "-m",
        "ppx.launch.agent_server",
        str(tmp_path / "a"),
        str(gone.pid),
        AGENT_MODULE,
        "-",  # PRELOAD
        "-",  # OPTIONS
        "-",  # PAD
    ]
    assert subprocess.run(command, timeout=60).returncode == 0
    assert not (tmp_path / "a").exists()
    start = f"import time; from ppx.launch.agent_server import start_server; start_server({str(tmp_path / 'b')!r}); time.sleep(60)"
    starter = subprocess.Popen([sys.executable, "-c", start])
    try:
        wait_for(tmp_path / "b")
        assert (tmp_path / "b").exists()
        (server,) = map(int, Path(f"/proc/{starter.pid}/task/{starter.pid}/children").read_text().split())
    finally:
        starter.kill()
        starter.wait()
    deadline = time.monotonic() + 30
    while _running(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(server), "the server outlived its starter"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
