"""Shared test helpers, imported as ``from helpers import ...`` (tests/conftest.py puts tests/
on sys.path). Importing this package hides the GPUs from the processes tests start
(helpers/gpus.py); helpers.wandb_file and helpers.slurm_cluster are imported by name."""

from helpers.gpus import CUDA_DEVICES, GPU_ENV
from helpers.run import (
    DATA,
    PICTURED_1F1B,
    REPO,
    SharedRun,
    free_port,
    measured_peaks,
    ppx,
    read_json,
    read_jsonl,
    run_args,
    torchrun_ppx,
)

__all__ = [
    "CUDA_DEVICES",
    "GPU_ENV",
    "DATA",
    "PICTURED_1F1B",
    "REPO",
    "SharedRun",
    "free_port",
    "measured_peaks",
    "ppx",
    "read_json",
    "read_jsonl",
    "run_args",
    "torchrun_ppx",
]
