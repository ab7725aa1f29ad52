"""torch.profiler per rank, ``PP:<action>`` labels around every program item, and
``ProfilerStep#N`` ranges that are ppx's step N and nothing else.

Only built when ``profile.enabled``: with profiling off neither the profiler nor the labels
exist (`NO_PROFILER` stands in, doing nothing), so they cost nothing. Traces go to
``<run>/tb/rank<r>.<ns>.pt.trace.json``, as ``tensorboard_trace_handler`` names them, beside the
run's TensorBoard scalars (one TensorBoard run), the layout TensorBoard's PyTorch Profiler
plugin and Holistic Trace Analysis read. A trace that could not be written (torch's export
logs it and returns: a full disk, a file-size limit) fails the rank as any write does.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

STEP_NAME = "ProfilerStep#{}"  # what the profiler's tools (its TensorBoard plugin, HTA) read as a step


class TraceNotWritten(OSError):
    """A profiler trace that torch's export did not write (it does not raise)."""


class RecordFunctions:
    """Observer: each item runs inside ``record_function("<prefix><label>")`` (``PP:``: the
    run's; run.paired's entries have theirs)."""

    def __init__(self, prefix: str = "PP:"):
        self._stack: list = []
        self.prefix = prefix

    def before(self, item) -> None:
        ctx = record_function(f"{self.prefix}{item.label}")
        ctx.__enter__()
        self._stack.append(ctx)

    def after(self, item) -> None:
        self._stack.pop().__exit__(None, None, None)


class StepProfiler:
    """torch.profiler whose steps are ppx's: ``with prof.step(n):`` around exactly the timed
    pipeline step marks it ``ProfilerStep#n``, and ``prof.next_step()`` afterwards moves the
    profiler's wait/warmup/active schedule on by one. torch's own marks (which would run from
    one ``profile.step()`` call to the next, so everything between steps too) are switched off.
    ``prof.label("ppx:...")`` marks the work ppx does between steps. A trace not written raises
    `TraceNotWritten` from the ``next_step()`` or the exit that exported it."""

    def __init__(self, prof_cfg, run_dir: Path, worker: str, device: torch.device):
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._traces, self._worker = run_dir / "tb", worker  # beside the scalars: one run in TensorBoard
        self._traces.mkdir(exist_ok=True)
        self._lost: Path | None = None  # a trace the export did not write
        self._prof = profile(
            activities=activities,
            schedule=schedule(
                wait=prof_cfg.wait, warmup=prof_cfg.warmup, active=prof_cfg.active, repeat=prof_cfg.repeat
            ),
            on_trace_ready=self._export,
            record_shapes=prof_cfg.record_shapes,
            profile_memory=prof_cfg.profile_memory,
            with_stack=prof_cfg.with_stack,
            experimental_config=_all_threads(),
        )
        if not hasattr(self._prof, "record_steps"):  # torch's switch for its own marks: fail loudly if it goes
            raise RuntimeError("torch.profiler.profile has no record_steps: ppx cannot mark its own steps")
        self._prof.record_steps = False

    def _export(self, prof) -> None:
        """torch's ``tensorboard_trace_handler``, the file checked: kineto writes ``<file>.tmp``
        and renames it, and on a failed write logs "Failed to write to log file!" and returns,
        the part written left as ``.tmp``; that is removed, the file kept in ``_lost``."""
        path = self._traces / f"{self._worker}.{time.time_ns()}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        if not path.exists():
            path.with_name(path.name + ".tmp").unlink(missing_ok=True)
            self._lost = path

    def _check(self) -> None:
        if self._lost is not None:
            lost, self._lost = self._lost, None
            raise TraceNotWritten(f"torch.profiler could not write {lost} (a full disk, a file-size limit?)")

    def __enter__(self):
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        self._prof.__exit__(*exc)
        if exc[0] is None:  # (else the rank's own error is its line)
            self._check()

    def step(self, n: int):
        return record_function(STEP_NAME.format(n))

    def next_step(self) -> None:
        self._prof.step()
        self._check()

    @staticmethod
    def label(name: str):
        return record_function(name)


def _all_threads():
    """Record every thread, so ``ppx:gather_records`` (a background thread's) is in the trace;
    None on a torch without the switch (then only the main thread's work is)."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        return None


class _NoProfiler:
    """Profiling off: every mark is a no-op."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def step(self, n: int):
        return contextlib.nullcontext()

    def next_step(self) -> None:
        pass

    @staticmethod
    def label(name: str):
        return contextlib.nullcontext()


NO_PROFILER = _NoProfiler()


def make_profiler(prof_cfg, run_dir: Path, rank: int, device: torch.device, replica: int = 0):
    """A `StepProfiler` when ``profile.enabled``, else `NO_PROFILER`. ``rank``: the pipeline
    rank, as every rank-indexed file names it; a replica's but the first (``parallel.data``)
    traces are ``rank<r>-replica<d>``."""
    if not prof_cfg.enabled:
        return NO_PROFILER
    return StepProfiler(prof_cfg, run_dir, f"rank{rank}" + (f"-replica{replica}" if replica else ""), device)
