"""The machine a check runs on: how many GPUs, and the facts the report names (devices,
driver, CUDA, NCCL, torch).

The CUDA facts are read in a short child process, so this process never creates a CUDA
context: the runs it starts get every GPU whole (a context costs hundreds of MiB, and a GPU in
exclusive-process mode would refuse the runs)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass

from ppx.launch.environment import git_state
from ppx.paths import source_checkout


@dataclass(frozen=True)
class Machine:
    """``device``: "cuda", or "cpu" under the test switch (every run on CPU with gloo, sizes
    ``small``); ``gpus``: CUDA devices visible (0 on CPU)."""

    device: str
    gpus: int
    small: bool = False

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def ranks(self, most: int) -> int:
        """Pipeline ranks for a run that gives each its own GPU: the largest power of two up
        to the GPUs and ``most`` (so 8 microbatches split evenly; 3 GPUs give 2). On one GPU,
        or on CPU, which stands in for one: 1, one rank holding every stage."""
        n = min(self.gpus, most) if self.cuda else 1
        return 1 << (max(n, 1).bit_length() - 1)

    @property
    def where(self) -> str:
        if not self.cuda:
            return "CPU with gloo (the test switch: small sizes, the CUDA-only rows skipped)"
        return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"


_CUDA_FACTS = """
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "devices": []}
try:
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    out["nccl"] = None
try:  # the CUDA version the driver supports (cuDriverGetVersion), not torch's build
    import ctypes
    v = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
    out["cuda_driver_api"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
except Exception:
    out["cuda_driver_api"] = None
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    out["devices"].append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                           "capability": f"sm_{p.major}{p.minor}", "multiprocessors": p.multi_processor_count})
print(json.dumps(out))
"""


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), or None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        r = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = r.stdout.strip().splitlines()
    return lines[0].strip() if r.returncode == 0 and lines else None


def facts(machine: Machine) -> dict:
    """What the report's header names: versions, devices, host, ppx's commit, the load."""
    out = {
        "where": machine.where,
        "gpus": machine.gpus,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "load_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }
    checkout = source_checkout()
    out["ppx_git"] = git_state(checkout) if checkout else {"commit": None, "dirty": None}
    if machine.cuda:
        r = subprocess.run([sys.executable, "-c", _CUDA_FACTS], capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            out.update(json.loads(r.stdout.strip().splitlines()[-1]))
        else:
            out["cuda_facts_error"] = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        out["driver"] = nvidia_driver()
    else:
        import torch

        out.update({"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None, "devices": []})
    return out


def describe(f: dict) -> str:
    """One line: the devices and versions."""
    names = {}
    for d in f.get("devices", []):
        key = f"{d['name']} ({d['memory_gib']} GiB, {d['capability']})"
        names[key] = names.get(key, 0) + 1
    devices = ", ".join(f"{n} x {k}" for k, n in names.items()) or f.get("where", "CPU")
    return (
        f"{devices}; driver {f.get('driver') or '-'} (CUDA driver API {f.get('cuda_driver_api') or '-'}), "
        f"CUDA {f.get('cuda') or '-'} (torch's build), NCCL {f.get('nccl') or '-'}, torch {f.get('torch')}, "
        f"Python {f.get('python')}"
    )
