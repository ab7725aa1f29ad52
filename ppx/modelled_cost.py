"""Modelled compute time: a module whose cost is set rather than computed (the known-cost
model) *charges* seconds to the running action, and the runtime waits them out when the
action ends, so the action lasts exactly the charge from `begin_action` to `end_action`,
framework overhead included. Both runtimes (ppx's and the torch backend) bracket every
per-microbatch forward/backward with `begin_action` / `end_action`.
"""

from __future__ import annotations

import time

from ppx.instrument.clock import sleep_until

_running: list | None = None  # [start perf_counter, charged seconds] of the running action


def begin_action() -> None:
    """A forward/backward action starts now."""
    global _running
    _running = [time.perf_counter(), 0.0]


def charge(seconds: float) -> bool:
    """Add ``seconds`` to the running action; False when none runs (the caller waits)."""
    if _running is None:
        return False
    _running[1] += seconds
    return True


def end_action() -> None:
    """The action's work is done: wait until its charge has elapsed since it began."""
    global _running
    running, _running = _running, None
    if running is not None and running[1] > 0:
        sleep_until(running[0] + running[1])
