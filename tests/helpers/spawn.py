"""The jobs of tests/dist: torch.multiprocessing's processes, forked from one server process
that imported torch and ppx once (multiprocessing's forkserver), not each started afresh to
import them again (``mp.spawn``: about 2 s of CPU a process). The server computes nothing, so
its forks inherit no OpenMP or CUDA state. They inherit the environment the server started
with (at a process's first job), transformers' import settings as ppx sets them among it
(`ppx.models.hf_config.IMPORT_SETTINGS`): what a job needs that a test sets later goes in its
args."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from datetime import timedelta

import torch.multiprocessing as mp

from ppx.models.hf_config import MODEL_MODULES

# (transformers: model.kind=hf's, where installed, imported as ppx imports it: `_start_server`;
# the fork server skips only an ImportError, so a transformers broken otherwise fails every job)
PRELOAD = [
    "torch",
    "torch.distributed",
    "ppx.config",
    "ppx.models",
    "ppx.engine.rank",
    "ppx.engine.torch_executor",
    *MODEL_MODULES,
]


def spawn(fn, args: tuple, nprocs: int) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes, joined; as ``mp.spawn``, an error in any is raised here."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts: the first job
    _start_server()
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int, timeout_s: float = 120):
    """A job's process group over gloo on this machine (one thread a process), destroyed after
    the body, whatever it raised."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _start_server() -> None:
    """The fork server started (once a process) with transformers' import settings as ppx
    imports it (`ppx.models.hf_config.IMPORT_SETTINGS`: offline, quiet), which its preload
    reads; this process's environment as it was after."""
    from multiprocessing import forkserver

    from ppx.models.hf_config import IMPORT_SETTINGS

    added = [k for k in IMPORT_SETTINGS if k not in os.environ]
    os.environ.update({k: IMPORT_SETTINGS[k] for k in added})
    try:
        forkserver.ensure_running()
    finally:
        for key in added:
            os.environ.pop(key)
