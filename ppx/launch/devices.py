"""Which device a run takes: CUDA with one GPU per local process, else CPU with gloo."""

from __future__ import annotations

import os

from ppx.errors import UserError

# A CPU run's processes see no GPU. Where one is available, torch's optimizer step asks for the
# accelerator's current stream, which starts CUDA in every CPU rank (a context each, on GPU 0),
# and in ranks forked from torchrun's agent fails the first step outright ("CUDA error:
# initialization error": the agent's imports touched CUDA; seen on an H200 host, 2026-11-30).
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}


def has_gpu_driver() -> bool:
    """Whether this machine has a GPU driver (NVIDIA's, AMD's, WSL's), seen without torch."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg"))


def gpu_count(usable: bool = True) -> int:
    """CUDA devices visible here. Without a GPU driver on the machine the answer is 0 at once,
    without importing torch (1.5 s on a small CPU machine, paid by every ``ppx run``).
    ``usable`` False: the devices counted without starting CUDA in this process (by NVML, as
    torch counts before CUDA starts), for a process that may yet run on CPU: once started, CUDA
    keeps the GPUs `CPU_ONLY` would hide (a rank under srun falling back to CPU); True: 0 where
    CUDA cannot start."""
    if not has_gpu_driver():
        return 0
    import torch

    if not usable:
        return torch.cuda.device_count()
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_device(requested: str, procs_per_node: int, multi_node: bool = False) -> tuple[str, str | None]:
    """('cuda' | 'cpu', a one-line notice or None). ``auto`` takes CUDA only when every
    process on this node gets its own GPU; ``multi_node`` makes the notice speak of this node's."""
    if requested == "cpu":
        return "cpu", None
    gpus = gpu_count(usable=False)
    if gpus >= procs_per_node:  # CUDA is to be taken: started now, to see that it can be
        gpus = gpu_count()
    if requested == "cuda":
        if gpus < procs_per_node:
            raise UserError(f"runtime.device=cuda needs {procs_per_node} GPUs on this node, found {gpus}")
        return "cuda", None
    if gpus >= procs_per_node:
        return "cuda", None
    procs = f"this node's {procs_per_node} processes" if multi_node else f"{procs_per_node} processes"
    return "cpu", f"ppx: {procs} need {procs_per_node} GPUs, found {gpus}: running on CPU with gloo"
