"""The GPUs this machine has, counted before they are hidden from every process a test starts.

Every run a test starts is a CPU + gloo run, whatever GPUs this machine has (experiments
default to runtime.device=auto, which takes the GPUs when there are enough): the tests check
the CPU path, and several ranks of one job on one GPU would abort NCCL. Importing this module
(tests/conftest.py does, before any test) counts the GPUs and then sets
CUDA_VISIBLE_DEVICES='' for this process and its children; tests that need the GPUs pass
GPU_ENV to the processes they start. pytest-xdist's workers count the GPUs their controller
found, not the none it left them."""

from __future__ import annotations

import os

import torch

# what the first test process found (its pid, the value), for its children that are test
# processes too: pytest-xdist's workers (`make test`), whose controller hid the GPUs first
_FOUND, _UNSET = "PPX_TESTS_CUDA_VISIBLE_DEVICES", "<unset>"
if _FOUND not in os.environ:
    os.environ[_FOUND] = f"{os.getpid()}:{os.environ.get('CUDA_VISIBLE_DEVICES', _UNSET)}"
elif os.environ[_FOUND].startswith(f"{os.getppid()}:") and "PYTEST_XDIST_WORKER" in os.environ:
    found = os.environ[_FOUND].split(":", 1)[1]
    if found == _UNSET:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = found
CUDA_DEVICES = torch.cuda.device_count()
_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
GPU_ENV = {"CUDA_VISIBLE_DEVICES": _visible if _visible is not None else ",".join(map(str, range(CUDA_DEVICES)))}
os.environ["CUDA_VISIBLE_DEVICES"] = ""
