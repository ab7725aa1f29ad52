"""What a run's env.json records: versions, backend, git state, hosts and each rank's device
and CPUs."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from ppx.config import Config
from ppx.paths import source_checkout


def git_state(where: Path) -> dict:
    """The checkout's commit and whether it is dirty. Read only: ``git status`` would otherwise
    refresh the index under ``index.lock``, which a git ended mid-write (a run's file-size limit,
    the job killed) left behind, and every git command of the user's after it failed."""

    def git(*args):
        env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")  # (--no-optional-locks, which gits before 2.15 refuse)
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, env=env)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
        return {"commit": head.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def rank_info(device) -> dict:
    """What one rank contributes to env.json (``device``: its torch.device)."""
    import torch  # here, not at the top: the launcher claims run directories without torch

    name = str(device)
    if device.type == "cuda":
        name += f" ({torch.cuda.get_device_name(device)})"
    from ppx.launch.affinity import describe

    info = {
        "hostname": socket.gethostname(),
        "device": name,
        "pid": os.getpid(),
        "cpus": describe(os.sched_getaffinity(0)),
    }
    if "GROUP_RANK" in os.environ:  # torchrun's node rank
        info["node_rank"] = int(os.environ["GROUP_RANK"])
    if "SLURMD_NODENAME" in os.environ:
        info["slurm_node"] = os.environ["SLURMD_NODENAME"]
        info["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    return info


def environment(cfg: Config, backend: str, world_size: int, ranks: list[dict]) -> dict:
    import torch

    checkout = source_checkout()
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "gloo": f"bundled with torch {torch.__version__}",
        "backend": backend,
        "platform": platform.platform(),
        "git": git_state(checkout) if checkout else {"commit": None, "dirty": None},
        "hostnames": sorted({r["hostname"] for r in ranks}),
        "ranks": ranks,
        "world_size": world_size,
        "seed": cfg.train.seed,
        "command": os.environ.get("PPX_COMMAND") or " ".join(sys.argv),
    }
