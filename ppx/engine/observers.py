"""Observers wrap program items: timers, memory counters, profiler labels, the watchdog and
fault injection all implement `Observer`, and every executor runs each item through
`run_observed`, the one place that says the order: ``before`` outermost first, ``after``
innermost first, like nested context managers. (An item that raises skips the ``after``s:
the step is abandoned.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from ppx.schedules.comms.program import Item

T = TypeVar("T")


class Observer(Protocol):
    def before(self, item: Item) -> None:
        """The item is about to run."""

    def after(self, item: Item) -> None:
        """The item has finished."""


def run_observed(observers: Sequence[Observer], item: Item, fn: Callable[..., T], *args) -> T:
    """``fn(*args)``, with every observer's ``before(item)`` in order around it and their
    ``after(item)`` in reverse order."""
    for o in observers:
        o.before(item)
    out = fn(*args)
    for o in reversed(observers):
        o.after(item)
    return out
