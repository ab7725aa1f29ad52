"""A rank's action list compiled into a program of items, the form both the runtime and
the simulator execute:
  ``post``    one batch of consecutive SEND/RECV actions, posted together;
  ``wait``    block until a received tensor has arrived (inserted before its consumer);
  ``compute`` F, B, I or W of one microbatch on one stage;
  ``drain``   end of step: wait until every send has completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ppx.schedules.action import Action
from ppx.schedules.lowering import comm_batches, input_receive, peer_of, receive_early


@dataclass(frozen=True)
class Item:
    """One program item; ``label`` names it in timelines and error messages."""

    kind: str  # "post" | "wait" | "compute" | "drain"
    actions: tuple[Action, ...]
    label: str


def compile_program(row: Sequence[Action], stage_to_rank: Sequence[int] = (), recv_lookahead: int = 0) -> list[Item]:
    """Group comm runs into ``post`` items and put a ``wait`` before each consumer of a
    received tensor (labelled with the rank it waits for, when ``stage_to_rank`` is given).
    ``recv_lookahead`` != 0 posts receives earlier (`receive_early`: k > 0 that many compute
    actions early, -1 all at the first wait); a batch is posted in the list's order."""
    row = receive_early(row, recv_lookahead)
    starts = dict(comm_batches(row))
    program: list[Item] = []
    received: set[Action] = set()
    k = 0
    while k < len(row):
        if k in starts:
            batch = tuple(row[k : starts[k]])
            program.append(Item("post", batch, " ".join(map(str, batch))))
            received |= {a for a in batch if not a.op.is_send}
            k = starts[k]
            continue
        a = row[k]
        recv = input_receive(a)
        if recv is not None and recv in received:
            src = f" from rank {peer_of(recv, stage_to_rank)[0]}" if stage_to_rank else ""
            program.append(Item("wait", (recv,), f"wait {recv}{src}"))
        program.append(Item("compute", (a,), str(a)))
        k += 1
    program.append(Item("drain", (), "wait sends"))
    return program
