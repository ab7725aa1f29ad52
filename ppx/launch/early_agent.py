"""torchrun's agent made ready while ``ppx run`` reads and checks the experiment: an agent
server (`ppx.launch.agent_server`) started as ``ppx run`` starts imports torch,
``torch._dynamo``, the worker's modules (and transformers' for a Hugging Face model) on another
core, then forks the CPU job's agent (`ppx.launch.served_agent`), so the run does not wait for
imports that could run beside its checks. None is started where the run would not use it (a
rank started by torchrun or srun, one core, a machine with a GPU driver unless the run says
``runtime.device=cpu``, ``runtime.early_agent=false``, and, where the command line or the
experiment's file sets them, ``runtime.device=cuda``, ``runtime.fork_ranks=false`` or
``runtime.threads_per_rank`` above 1, which the server would refuse); a config refused, or a
job whose ranks are started (a GPU's), ends it. The server's folder is its own: ``ppx run``
removes it, or the server as it ends with a ``ppx run`` killed. A request it refused all the
same (`refused`) is said in one line as the run ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ppx.launch.processes import launched_by
from ppx.launch.served_agent import SERVER_ENV

LISTEN_S = 30.0  # the longest wait for a started server to listen (its Python starting, on a loaded machine)
SOCKET_BYTES = 107  # a Unix socket's path's most bytes on Linux (108 with its NUL)
# the keys whose values decide whether a server would serve the run: where none is typed (nor
# "hf", as a Hugging Face model's model.kind is), the defaults stand and no config is merged here
DECIDING = ("hf", "early_agent", "fork_ranks", "threads_per_rank", "device")


class EarlyAgent:
    """The server (`start`), the socket it listens at (`listening`), ended with its folder by
    `stop` (it also ends with this process, and then removes its folder itself)."""

    def __init__(self, proc: subprocess.Popen, folder: Path):
        self.proc, self.folder = proc, folder

    @classmethod
    def start(cls, experiment: str, overrides: list[str]) -> EarlyAgent | None:
        """The server for ``ppx run experiment overrides``, where it would start a torchrun job
        whose ranks it forks (above); None otherwise, and wherever it cannot be started (a
        full disk: the run goes on with a plain agent). Its environment is a CPU run's: CUDA
        hidden, one thread a rank."""
        if not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2:  # (imports beside the checks)
            return None
        if launched_by() is not None or os.environ.get(SERVER_ENV):
            return None
        try:
            preload = _preload(experiment, overrides)
            if preload is None:
                return None
            return cls._started(preload)
        except Exception:
            return None

    @classmethod
    def _started(cls, preload: list[str]) -> EarlyAgent | None:
        from ppx.launch.agent_server import start_server
        from ppx.launch.devices import CPU_ONLY

        # (the temporary folder, or where its path is too long for a socket's, /tmp)
        base = next((b for b in (tempfile.gettempdir(), "/tmp") if len(os.fsencode(b)) + 30 <= SOCKET_BYTES), None)
        if base is None:
            return None
        folder = Path(tempfile.mkdtemp(prefix="ppx-agent-", dir=base))
        try:
            proc = start_server(folder / "socket", preload=preload, env=dict(os.environ, **CPU_ONLY), early=True)
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(proc, folder)

    def listening(self) -> str | None:
        """The server's socket once it listens (its requests then wait for its imports); None
        where it ended first, or did not listen within `LISTEN_S` (the job gets a plain agent)."""
        socket = self.folder / "socket"
        deadline = time.monotonic() + LISTEN_S
        while not socket.exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return str(socket) if socket.exists() and self.proc.poll() is None else None

    def refused(self) -> str | None:
        """A line for a request the server did not serve (its reason: the job's agent was a new
        process, which imported torch again after the server had), or None."""
        from ppx.launch.agent_server import refused_path

        try:
            reason = refused_path(self.folder / "socket").read_text().split("\t", 1)[0].strip()
        except OSError:
            return None
        return f"ppx: note: the agent imported while the config was checked did not serve this run ({reason}); runtime.early_agent=false starts none"

    def stop(self) -> None:
        """The server ended (and any agent it forked), its folder removed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _preload(experiment: str, overrides: list[str]) -> list[str] | None:
    """What the server imports besides torchrun's agent's own (transformers' model classes for
    model.kind=hf), or None where the run would not use a server, read from the config's first
    merge (with runtime.cpu_fallback's keys, as a run on CPU takes them) where the overrides or
    the experiment's file type one of `DECIDING`."""
    from ppx.launch.agent_server import TRANSFORMERS
    from ppx.launch.devices import has_gpu_driver

    if not _typed(experiment, overrides):
        return None if has_gpu_driver() else []
    from ppx.config.loading import first_merge

    conf = first_merge(experiment, overrides)
    if conf is None:  # (ppx run's own load says what is wrong)
        return []
    if conf.runtime.cpu_fallback and conf.runtime.device != "cpu":
        conf = first_merge(experiment, [*conf.runtime.cpu_fallback, *overrides]) or conf
    rt = conf.runtime
    if not rt.early_agent or not rt.fork_ranks or rt.threads_per_rank != 1 or rt.device == "cuda":
        return None
    if rt.device != "cpu" and has_gpu_driver():  # (a GPU's run starts its ranks: the imports would take a core)
        return None
    return [TRANSFORMERS] if conf.model.kind == "hf" else []


def _typed(experiment: str, overrides: list[str]) -> bool:
    """Whether one of `DECIDING` is typed in the overrides or the experiment's file."""
    from ppx.config.loading import find_experiment

    if any(word in o for o in overrides for word in DECIDING):
        return True
    try:
        text = find_experiment(experiment).read_text(errors="replace")
    except Exception:  # (ppx run's own load says what is wrong with it)
        return False
    return any(word in text for word in DECIDING)
