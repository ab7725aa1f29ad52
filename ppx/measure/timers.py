"""Per-action timers: observers that record a `Span` for every program item.

`WallTimer` uses ``time.perf_counter`` (CPU). `CudaTimer` records CUDA events around every
item on the stream it runs on (an overlapped cell's: the side stream), with no host
synchronisation inside the step, and resolves them once per step (after the step's final
synchronize). Spans are in this process's
``perf_counter`` seconds; `ppx.measure.clock` maps them onto rank 0's clock.
"""

from __future__ import annotations

import time

import torch

from ppx.measure.spans import Span


class WallTimer:
    def __init__(self):
        self._times: list = []  # (item, start, end): Spans are built once per step, off the timed path
        self._start = 0.0

    def begin_step(self, step: int) -> None:
        self._times = []

    def before(self, item) -> None:
        self._start = time.perf_counter()

    def after(self, item) -> None:
        self._times.append((item, self._start, time.perf_counter()))

    def end_step(self, step: int) -> list[Span]:
        return [Span.of(item, start, end) for item, start, end in self._times]


class CudaTimer:
    """CUDA events around every item, recorded on the current stream and reused step after
    step; spans are resolved once per step, after the caller synchronized the device."""

    def __init__(self, device: torch.device):
        self.device = device
        self._events: list = []  # (start, end) per item position
        self._items: list = []  # this step's items, in order
        self._ended = 0
        self._origin = torch.cuda.Event(enable_timing=True)
        self._host_origin = 0.0

    def begin_step(self, step: int) -> None:
        self._items = []
        self._ended = 0  # items whose end event is recorded (the host has queued all of them)
        torch.cuda.synchronize(self.device)  # the stream is idle: the origin event fires now
        self._origin.record()
        self._host_origin = time.perf_counter()

    def before(self, item) -> None:
        k = len(self._items)
        if k == len(self._events):
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        self._items.append(item)
        self._events[k][0].record()

    def after(self, item) -> None:
        self._events[len(self._items) - 1][1].record()
        self._ended = len(self._items)

    def end_step(self, step: int) -> list[Span]:
        """Resolve the events (the caller has synchronized the device)."""
        t0, origin = self._host_origin, self._origin
        return [
            Span.of(item, t0 + origin.elapsed_time(a) / 1e3, t0 + origin.elapsed_time(b) / 1e3)
            for item, (a, b) in zip(self._items, self._events)
        ]

    def device_position(self) -> str | None:
        """The label of this step's first item the GPU has not finished, or None. Safe from
        another thread (the watchdog's): the host queues a step ahead of the GPU, so where the
        host waits (the step's final synchronize) says little about where a hang is. An item
        the host is still inside (its end event not recorded) is unfinished too: the host can
        wait there on the GPU's earlier work (a kernel's first launch loads its module, which
        waits for the device)."""
        items, ended = list(self._items), self._ended
        with torch.cuda.device(self.device):
            for k, (item, (_, end)) in enumerate(zip(items, self._events)):
                if k >= ended or not end.query():
                    return item.label
        return None
