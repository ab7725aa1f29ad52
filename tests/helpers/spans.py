"""Measured spans written by hand, for the tests of what reads them."""

from __future__ import annotations

from ppx.measure.spans import Span
from ppx.schedules.ir.action import Action


def span(kind: str, label: str, actions: list[str], start: float, end: float) -> Span:
    """A measured `Span` written by hand: action texts parsed."""
    return Span(kind, label, tuple(Action.parse(a) for a in actions), start, end)
