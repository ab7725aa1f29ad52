"""Whether a planned shape runs on this machine: p ranks on its GPUs, or on a handful of CPU
processes; larger plans are predictions for a cluster."""

from __future__ import annotations

CPU_RANKS = 8  # the most gloo ranks on CPU ppx runs here in reasonable time


def gpus_here() -> int:
    """CUDA devices on this machine (0 without torch's CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def cluster_note(max_p: int, gpus: int | None = None) -> str | None:
    """A line saying the plan is for a cluster, when ``max_p`` ranks do not fit here; else None."""
    if max_p <= CPU_RANKS:
        return None
    gpus = gpus_here() if gpus is None else gpus
    if max_p <= gpus:
        return None
    here = f"{gpus} GPU(s)" if gpus else "no GPU"
    return (
        f"note: these are predictions for a cluster (up to {max_p} ranks), not runnable on this machine "
        f"({here}, at most {CPU_RANKS} CPU ranks)"
    )
