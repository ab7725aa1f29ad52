"""torchrun's agent made ready while ``ppx run`` reads and checks the experiment: an agent
server (`ppx.launch.agent_server`) started as ``ppx run`` starts imports torch,
``torch._dynamo``, the worker's modules (and transformers' for a Hugging Face model) on another
core, then forks the CPU job's agent (`ppx.launch.served_agent`), so the run does not wait for
imports that could run beside its checks. A job that starts its ranks (CUDA,
``runtime.fork_ranks=false``), or a config that fails its checks, ends the server; a request
it cannot serve gets a plain agent, as any does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ppx.launch.processes import launched_by, process_alive
from ppx.launch.served_agent import SERVER_ENV

PREFIX = "ppx-agent-"  # its folder in the temporary folder: ppx-agent-<ppx run's pid>-<random>
LISTEN_S = 30.0  # the longest wait for a started server to listen (its Python starting, on a loaded machine)


class EarlyAgent:
    """The server (`start`), the socket it listens at (`listening`), ended with its folder by
    `stop` (it also ends with this process)."""

    def __init__(self, proc: subprocess.Popen, folder: Path):
        self.proc, self.folder = proc, folder

    @classmethod
    def start(cls, experiment: str, overrides: list[str]) -> EarlyAgent | None:
        """The server for ``ppx run experiment overrides``, where it would start a torchrun job
        that could fork its ranks (Linux, two cores or more; not a rank itself; no server of
        the test suite's already named); None otherwise. Its environment is a CPU run's: CUDA hidden, one thread
        a rank; it imports transformers' model classes too where the run's model.kind reads as
        hf (its agent would import them after the checks: 3-4 s)."""
        if not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2:  # (imports beside the checks)
            return None
        if launched_by() is not None or os.environ.get(SERVER_ENV):
            return None
        from ppx.config.loading import model_kind
        from ppx.launch.agent_server import TRANSFORMERS, start_server
        from ppx.launch.devices import CPU_ONLY

        _remove_stale()
        hf = _types_hf(experiment, overrides) and model_kind(experiment, overrides) == "hf"
        preload = [TRANSFORMERS] if hf else []
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        try:
            proc = start_server(folder / "socket", preload=preload, env=dict(os.environ, **CPU_ONLY), quiet=True)
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return cls(proc, folder)

    def listening(self) -> str | None:
        """The server's socket once it listens (its requests then wait for its imports); None
        where it ended first or did not listen within `LISTEN_S` (the job gets a plain agent)."""
        socket = self.folder / "socket"
        deadline = time.monotonic() + LISTEN_S
        while not socket.exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return str(socket) if socket.exists() and self.proc.poll() is None else None

    def stop(self) -> None:
        """The server ended (and any agent it forked), its folder removed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _types_hf(experiment: str, overrides: list[str]) -> bool:
    """Whether "hf" is typed in the overrides or the experiment's file, as a run of
    model.kind=hf types it somewhere (the default kind is mlp; a preset's, llama): where it is
    not, the run's kind is not read (a merge of its config, 10-50 ms before the server starts)."""
    from ppx.config.loading import find_experiment

    if any("hf" in o for o in overrides):
        return True
    try:
        return "hf" in find_experiment(experiment).read_text(errors="replace")
    except Exception:  # (ppx run's own load says what is wrong with it)
        return False


def _remove_stale() -> None:
    """The folders of servers whose ``ppx run`` died without removing them (killed before its
    job started: SIGKILL, or the SIGTERM whose default action ends it)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
