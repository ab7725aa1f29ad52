"""The known-cost model's clock: a module whose cost is set rather than computed *charges*
seconds to the running action, and the executor waits them out when the action ends, so the
action lasts exactly its charge from `ActionClock.begin` to `ActionClock.end`, framework
overhead included. Each executor owns one clock per rank and passes it to the stage modules
it builds (nothing global): it brackets every per-microbatch forward/backward with
`begin`/`end` and says which part of a backward runs (``part``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from ppx.schedules.ir.action import Op

Part = Literal["full", "input", "weight"]
PART_OF: dict[Op, Part] = {Op.F: "full", Op.B: "full", Op.I: "input", Op.W: "weight"}  # each compute op's part

SPIN_S = 0.00025  # the last 0.25 ms is spun, not slept: sleep wake-ups come late (docs/benchmarks.md)


def sleep_until(deadline: float) -> None:
    """Sleep to just short of ``deadline`` (perf_counter seconds), then yield-spin to it:
    plain sleeps wake late (docs/benchmarks.md), and yielding keeps spinning ranks off busy
    cores."""
    left = deadline - time.perf_counter()
    if left > SPIN_S:
        time.sleep(left - SPIN_S)
    while time.perf_counter() < deadline:
        os.sched_yield()


class ActionClock:
    """The running action's start and charge (seconds), and which part of a backward runs:
    "full" (B, and forwards), "input" (I: gradients for the stage input only) or "weight"
    (W: parameter gradients only)."""

    def __init__(self) -> None:
        self._running: list | None = None  # [start perf_counter, charged seconds]
        self.part: Part = "full"
        # "full" or "selective" while a backward re-runs its stage's forward (train.recompute)
        self.recomputing: str | None = None

    def begin(self, part: Part = "full") -> None:
        """An action starts now."""
        self._running = [time.perf_counter(), 0.0]
        self.part = part

    def charge(self, seconds: float) -> bool:
        """Add ``seconds`` to the running action; False when none runs (the caller waits)."""
        if self._running is None:
            return False
        self._running[1] += seconds
        return True

    def end(self) -> None:
        """The action's work is done: wait until its charge has elapsed since it began."""
        running, self._running = self._running, None
        self.part = "full"
        if running is not None and running[1] > 0:
            sleep_until(running[0] + running[1])

    @contextmanager
    def action(self, part: Part = "full") -> Iterator[None]:
        """``with clock.action("input"): ...`` = begin, the work, end (also on error)."""
        self.begin(part)
        try:
            yield
        finally:
            self.end()
