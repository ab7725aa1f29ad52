"""The syntax of ``runtime.inject_fault``: ``hang@<action>`` or ``die@<action>``."""

from __future__ import annotations

from ppx.errors import ScheduleError, UserError
from ppx.schedules.ir.action import Action


def parse_fault(spec: str) -> tuple[str, Action]:
    """'hang@1F2' -> ('hang', 1F2); UserError for anything else."""
    kind, _, action = spec.partition("@")
    if kind not in ("hang", "die") or not action:
        raise UserError(f"runtime.inject_fault={spec!r} must look like hang@<action> or die@<action>, e.g. hang@1F2")
    try:
        return kind, Action.parse(action)
    except ScheduleError as e:  # (the action's own words, then which key they are of)
        raise UserError(f"runtime.inject_fault={spec!r}: {e}") from None
