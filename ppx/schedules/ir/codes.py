"""Actions as small integers, for the fast paths (simulator, validation, placement).

A rank's row becomes three parallel lists, its actions' stages, op codes and microbatches
(`Rows`); an op code is the op's index in `OPS` (F B I W, then SEND_F RECV_F SEND_B RECV_B:
``code >= COMM`` is a send or a receive). A message, the pair of a send and its receive, has
one integer key (`KEY_BASE`), the same from both ends. A `Schedule` keeps its rows once
made (`rows_of`), so repeated simulations do not convert its actions again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from ppx.schedules.ir.action import Action, Op

OPS: tuple[Op, ...] = (Op.F, Op.B, Op.I, Op.W, Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B)
F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B = range(8)  # noqa: E741
COMM = SEND_F  # op codes from here on are sends and receives
CODE = {op: k for k, op in enumerate(OPS)}
IS_BACKWARD = (False, True, True, True, False, False, False, False)
IS_SEND = (False, False, False, False, True, False, True, False)
SPAN = 1 << 40  # microbatches a message key keeps apart (far more than any schedule has)
# A message's key, the same at its send and its receive: (2 stage + KEY_BASE[op code]) SPAN +
# microbatch, that is (sending stage, direction, microbatch) as one integer. For F, B and I it
# is the key of the message carrying their input (F's activation, B's and I's gradient).
KEY_BASE = (-2, 3, 3, 0, 0, -2, 1, 3)

Rows = list[tuple[list[int], list[int], list[int]]]  # per rank: (stages, op codes, microbatches)
_make = partial(tuple.__new__, Action)


def encode(row) -> tuple[list[int], list[int], list[int]]:
    """One rank's actions as (stages, op codes, microbatches)."""
    if not row:
        return [], [], []
    stages, ops, mbs = zip(*row)
    return list(stages), list(map(CODE.__getitem__, ops)), list(mbs)


def decode(stages, codes, mbs) -> list[Action]:
    """The actions of one encoded row."""
    return list(map(_make, zip(stages, map(OPS.__getitem__, codes), mbs)))


def rows_of(schedule) -> Rows:
    """``schedule``'s actions encoded, rank by rank; made once per schedule and kept on it."""
    got = vars(schedule).get("_rows")
    if got is None:
        got = vars(schedule)["_rows"] = [encode(row) for row in schedule.actions]
    return got


def keep_rows(schedule, rows: Rows):
    """``schedule`` with ``rows``, its actions encoded, kept for `rows_of`; returns it."""
    vars(schedule)["_rows"] = rows
    return schedule


def text(stage: int, code: int, mb: int) -> str:
    """An encoded action as `Action` prints it: ``1F3``, ``2RECV_F5``."""
    return f"{stage}{OPS[code].value}{mb}"


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: encoding, placing and simulating make
    millions of small objects and no cycles, and each collection would scan them all for
    nothing (a third of a large placement's time). Reference counting still frees them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
