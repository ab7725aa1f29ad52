"""The jobs of tests/dist: torch.multiprocessing's processes, forked from one server process
that imported torch and ppx once (multiprocessing's forkserver), not each started afresh to
import them again (``mp.spawn``: about 2 s of CPU a process). The server computes nothing, so
its forks inherit no OpenMP or CUDA state. They inherit the environment the server started
with (at a process's first job): what a job needs that a test sets later goes in its args."""

from __future__ import annotations

import multiprocessing

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "ppx.config", "ppx.models", "ppx.engine.rank", "ppx.engine.torch_executor"]


def spawn(fn, args: tuple, nprocs: int) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes, joined; as ``mp.spawn``, an error in any is raised here."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts: the first job
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
