"""The action type: one step of one rank's schedule, in torch.distributed.pipelining notation.

``Action(stage=1, op=Op.F, mb=3)`` prints as ``1F3``: forward of microbatch 3 on stage 1.
Compute ops: F (forward), B (full backward), I (input-gradient backward), W (weight-gradient
backward). Communication ops: SEND_F/RECV_F move a stage's activation to/from the next stage,
SEND_B/RECV_B move a gradient to/from the previous stage; ``2RECV_F5`` is the receive of
microbatch 5's input on stage 2. An overlapped cell, torch's ``(0F3;3B1)OVERLAP_F_B``, is a
forward and a backward of another microbatch run together: two actions here, which the
schedule marks as one cell (`Schedule.overlaps`).
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple

from ppx.errors import ScheduleError


class Op(str, enum.Enum):
    F = "F"
    B = "B"
    I = "I"  # noqa: E741  (torch's name for input-gradient backward)
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_OPS

    @property
    def is_comm(self) -> bool:
        return not self.is_compute

    @property
    def is_send(self) -> bool:
        return self in (Op.SEND_F, Op.SEND_B)

    @property
    def is_backward(self) -> bool:
        """True for ops that produce gradients (B, I, W)."""
        return self in (Op.B, Op.I, Op.W)


COMPUTE_OPS = frozenset({Op.F, Op.B, Op.I, Op.W})

OVERLAP = "OVERLAP_F_B"
_OVERLAP_RE = re.compile(r"^\s*\(([^;()]+);([^;()]+)\)" + OVERLAP + r"\s*$")
# ASCII digits only (\d takes other scripts' digits, which int() reads: a cell would name another action)
_ACTION_RE = re.compile(r"^\s*([0-9]+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)([0-9]+)\s*$")


class Action(NamedTuple):
    """One action of a schedule: ``op`` on microbatch ``mb`` of stage ``stage``."""

    stage: int
    op: Op
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op.value}{self.mb}"

    def __repr__(self) -> str:
        return str(self)

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``"1F3"``, ``"0SEND_F1"``, ... (torch.distributed.pipelining's strings)."""
        m = _ACTION_RE.match(text)
        if not m:
            raise ScheduleError(f"cannot parse action {text!r} (expected e.g. 0F1, 1B3, 2SEND_F0)")
        return cls(int(m.group(1)), Op(m.group(2)), int(m.group(3)))


def F(stage: int, mb: int) -> Action:
    return Action(stage, Op.F, mb)


def B(stage: int, mb: int) -> Action:
    return Action(stage, Op.B, mb)


def I(stage: int, mb: int) -> Action:  # noqa: E743
    return Action(stage, Op.I, mb)


def W(stage: int, mb: int) -> Action:
    return Action(stage, Op.W, mb)


def overlap_string(forward: Action, backward: Action) -> str:
    """torch's string of an overlapped cell: ``(0F3;3B1)OVERLAP_F_B``."""
    return f"({forward};{backward}){OVERLAP}"


def parse_cell(text: str) -> tuple[Action, ...]:
    """One action, or the two of an overlapped cell ``(0F3;3B1)OVERLAP_F_B`` (a forward, then
    a full or input-gradient backward)."""
    m = _OVERLAP_RE.match(text)
    if not m:
        return (Action.parse(text),)
    f, b = Action.parse(m.group(1)), Action.parse(m.group(2))
    if f.op is not Op.F or b.op not in (Op.B, Op.I):
        raise ScheduleError(
            f"cannot parse action {text!r}: an overlapped cell is a forward and a backward, e.g. (0F3;3B1){OVERLAP}"
        )
    return (f, b)
