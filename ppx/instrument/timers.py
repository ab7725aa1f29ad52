"""Per-action timers: observers that record a (item, start, end) span for every program item.

`WallTimer` uses ``time.perf_counter`` (CPU). `CudaTimer` records CUDA events on the compute
stream around every item, with no host synchronisation inside the step, and resolves them
once per step (after the step's final synchronize). Spans are in this process's
``perf_counter`` seconds; `ppx.instrument.clock` maps them onto rank 0's clock.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch


class WallTimer:
    def __init__(self):
        self.spans: list = []
        self._start = 0.0

    def begin_step(self, step: int) -> None:
        self.spans = []

    def before(self, item) -> None:
        self._start = time.perf_counter()

    def after(self, item) -> None:
        self.spans.append((item, self._start, time.perf_counter()))

    def end_step(self, step: int) -> list:
        return self.spans


class CudaTimer:
    """CUDA events around every item of ``program`` (the rank's fixed item list)."""

    def __init__(self, program: Sequence, device: torch.device):
        self.program = list(program)
        self.device = device
        self._events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in self.program
        ]
        self._origin = torch.cuda.Event(enable_timing=True)
        self._host_origin = 0.0
        self._k = 0

    def begin_step(self, step: int) -> None:
        self._k = 0
        torch.cuda.synchronize(self.device)  # the stream is idle: the origin event fires now
        self._origin.record()
        self._host_origin = time.perf_counter()

    def before(self, item) -> None:
        self._events[self._k][0].record()

    def after(self, item) -> None:
        self._events[self._k][1].record()
        self._k += 1

    def end_step(self, step: int) -> list:
        """Resolve the events (the caller has synchronized the device)."""
        t0, origin = self._host_origin, self._origin
        return [
            (item, t0 + origin.elapsed_time(a) / 1e3, t0 + origin.elapsed_time(b) / 1e3)
            for item, (a, b) in zip(self.program[: self._k], self._events)
        ]
