"""How processes get started: who started this one (torchrun, srun or a user), and the
torchrun command and environment ``ppx run`` starts its workers with."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path


def launched_by(env=os.environ) -> str | None:
    """'torchrun' inside a torchrun worker, 'srun' inside a multi-task srun step, else None."""
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
        return "torchrun"
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_ID" in env:
        return "srun"
    return None


FORK = "--start-method=fork"  # torchrun's argument for forked workers (`ppx.launch.torchrun` looks for it)


def torchrun_command(nproc: int, run_dir: Path, fork: bool = False) -> list[str]:
    """torchrun on this machine, ``nproc`` workers of ``run_dir``'s run. ``fork`` (CPU runs):
    the workers are forked from torchrun's agent, which imported torch and the worker's
    modules once (`ppx.launch.forked_worker`), not started as ``python -m ppx.launch.worker``,
    each importing them again."""
    # torchrun stops the other workers at its first look after one fails. Started workers:
    # a look every 0.5 s (not its 0.1 s) leaves the survivors time to name the dead peer and
    # exit on their own. Forked ones: `ppx.launch.torchrun` holds a failure back for that
    # time (FAILED_GRACE_S) itself, so a look every 0.1 s ends a completed job sooner
    start = ["--run-path", FORK, forked_worker_path()] if fork else ["-m", "ppx.launch.worker"]
    return [
        sys.executable,
        "-m",
        "ppx.launch.torchrun",
        "--standalone",
        "--nnodes=1",
        f"--monitor-interval={0.1 if fork else 0.5}",
        f"--nproc-per-node={nproc}",
        *start,
        str(run_dir),
    ]


def forked_worker_path() -> str:
    """The file torchrun runs in each forked worker (its command line is the agent's)."""
    return str(Path(__file__).with_name("forked_worker.py"))


def worker_env(device: str, threads: int, command: str) -> dict:
    env = dict(os.environ)
    env.update(PPX_DEVICE=device, PPX_COMMAND=command, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if device == "cpu":
        from ppx.launch.devices import CPU_ONLY

        env.update(CPU_ONLY)
    return env


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (field N at index N - 3), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` in /proc (R, S, T for stopped, Z for zombie), None if gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def zombie_status(pid: int) -> int | None:
    """The wait status of ``pid`` while it is a zombie (stat field 52, Linux 3.5 on), None
    where it is not one (reaped: the pid may be another process's now)."""
    fields = stat_fields(pid)
    if not fields or fields[0] != "Z" or len(fields) < 50 or not fields[49].isdigit():
        return None
    return int(fields[49])


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process of this machine (not gone, not a zombie)."""
    return process_state(pid) not in (None, "Z", "X")


PR_SET_PDEATHSIG = 1


def follow_parent(parent: str | None) -> bool:
    """SIGTERM this process when its parent dies, where ``parent`` is the parent's pid (``ppx
    run``'s, for its torchrun; ``ppx sweep``'s, for a point's ``ppx run``: a kill -9 of the
    parent then leaves no job behind); None, or not Linux: nothing. False where that parent
    is gone already (it died before the request was made; the caller ends); a parent named
    that is alive but not this process's (a value left in the environment) is no death."""
    if not parent or not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return True
    return str(os.getppid()) == parent or (parent.isdigit() and process_alive(int(parent)))
