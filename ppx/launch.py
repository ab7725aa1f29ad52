"""How processes get started: detect torchrun/srun, pick the device, build the torchrun command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

from ppx.errors import UserError


def launched_by(env=os.environ) -> Optional[str]:
    """'torchrun' inside a torchrun worker, 'srun' inside a multi-task srun step, else None."""
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
        return "torchrun"
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_ID" in env:
        return "srun"
    return None


def slurm_head_address(nodelist: str) -> str:
    """The first node of a SLURM node list, as its NodeAddr from ``scontrol show node``."""
    first = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    head = first.stdout.split()[0]
    shown = subprocess.run(["scontrol", "show", "node", head], capture_output=True, text=True, check=True)
    m = re.search(r"NodeAddr=(\S+)", shown.stdout)
    return m.group(1) if m else head


def _tasks_on_this_node(env) -> int:
    """This node's task count from SLURM_TASKS_PER_NODE (always set; '2(x3),1' = 2,2,2,1 by
    node), else SLURM_NTASKS_PER_NODE (set only with --ntasks-per-node), else 1."""
    counts = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = int(env.get("SLURM_NODEID", "0") or 0)
    if node < len(counts):
        return counts[node]
    return int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)


def adopt_srun_env(env=os.environ) -> None:
    """Translate srun's task variables into torch.distributed's env:// variables."""
    env.setdefault("RANK", env["SLURM_PROCID"])
    env.setdefault("WORLD_SIZE", env["SLURM_NTASKS"])
    env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    env.setdefault("LOCAL_WORLD_SIZE", str(_tasks_on_this_node(env)))
    if "MASTER_ADDR" not in env:
        env["MASTER_ADDR"] = slurm_head_address(env["SLURM_JOB_NODELIST"])
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))


def gpu_count() -> int:
    """CUDA devices visible here. Without a GPU driver on the machine the answer is 0 at once,
    without importing torch (1.5 s on a small CPU machine, paid by every ``ppx run``)."""
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_device(requested: str, procs_per_node: int, multi_node: bool = False) -> tuple[str, Optional[str]]:
    """('cuda' | 'cpu', a one-line notice or None). ``auto`` takes CUDA only when every
    process on this node gets its own GPU; ``multi_node`` makes the notice speak of this node's."""
    if requested == "cpu":
        return "cpu", None
    gpus = gpu_count()
    if requested == "cuda":
        if gpus < procs_per_node:
            raise UserError(f"runtime.device=cuda needs {procs_per_node} GPUs on this node, found {gpus}")
        return "cuda", None
    if gpus >= procs_per_node:
        return "cuda", None
    stages = f"this node's {procs_per_node} stages" if multi_node else f"{procs_per_node} stages"
    return "cpu", f"ppx: {stages} need {procs_per_node} GPUs, found {gpus}: running on CPU with gloo"


def torchrun_command(nproc: int, run_dir: Path) -> list[str]:
    # torchrun stops the other workers at its first look after one fails; every 0.5 s (not
    # its 0.1 s) leaves the survivors time to name the dead peer and exit on their own
    return [
        sys.executable, "-m", "ppx.torchrun", "--standalone", "--nnodes=1", "--monitor-interval=0.5",
        f"--nproc-per-node={nproc}", "-m", "ppx.worker", str(run_dir),
    ]


def worker_env(device: str, threads: int, command: str) -> dict:
    env = dict(os.environ)
    env.update(PPX_DEVICE=device, PPX_COMMAND=command, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env
