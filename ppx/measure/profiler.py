"""torch.profiler per rank, and ``PP:<action>`` labels around every program item.

Only built when ``profile.enabled``: with profiling off neither the profiler nor the labels
exist, so they cost nothing. Traces go to ``<run>/tb/rank<r>.<ns>.pt.trace.json`` through
``tensorboard_trace_handler``, the layout TensorBoard's PyTorch Profiler plugin and
Holistic Trace Analysis read.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler


class RecordFunctions:
    """Observer: each item runs inside ``record_function("PP:<label>")``."""

    def __init__(self):
        self._stack: list = []

    def before(self, item) -> None:
        ctx = record_function(f"PP:{item.label}")
        ctx.__enter__()
        self._stack.append(ctx)

    def after(self, item) -> None:
        self._stack.pop().__exit__(None, None, None)


def make_profiler(prof_cfg, run_dir: Path, rank: int, device: torch.device) -> profile:
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    traces = run_dir / "tb"  # beside the scalars: one run in TensorBoard
    traces.mkdir(exist_ok=True)
    return profile(
        activities=activities,
        schedule=schedule(wait=prof_cfg.wait, warmup=prof_cfg.warmup, active=prof_cfg.active, repeat=prof_cfg.repeat),
        on_trace_ready=tensorboard_trace_handler(str(traces), worker_name=f"rank{rank}"),
        record_shapes=prof_cfg.record_shapes,
        profile_memory=prof_cfg.profile_memory,
        with_stack=prof_cfg.with_stack,
    )
