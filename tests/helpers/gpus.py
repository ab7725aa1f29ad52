"""The GPUs this machine has, counted before they are hidden from every process a test starts.

Every run a test starts is a CPU + gloo run, whatever GPUs this machine has (experiments
default to runtime.device=auto, which takes the GPUs when there are enough): the tests check
the CPU path, and several ranks of one job on one GPU would abort NCCL. Importing this module
(tests/conftest.py does, before any test) counts the GPUs and then sets
CUDA_VISIBLE_DEVICES='' for this process and its children; tests that need the GPUs pass
GPU_ENV to the processes they start."""

from __future__ import annotations

import os

import torch

CUDA_DEVICES = torch.cuda.device_count()
_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
GPU_ENV = {"CUDA_VISIBLE_DEVICES": _visible if _visible is not None else ",".join(map(str, range(CUDA_DEVICES)))}
os.environ["CUDA_VISIBLE_DEVICES"] = ""
