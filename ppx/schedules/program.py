"""A rank's action list compiled into a program of items, the form both the runtime and
the simulator execute:
  ``post``    one batch of consecutive SEND/RECV actions, posted together;
  ``wait``    block until a received tensor has arrived (inserted before its consumer);
  ``compute`` F, B, I or W of one microbatch on one stage;
  ``drain``   end of step: wait until every send has completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppx.schedules.action import Action
from ppx.schedules.lowering import comm_batches, input_receive, peer_of, receive_early


@dataclass(frozen=True)
class Item:
    """One program item; ``label`` names it in timelines and error messages."""

    kind: str  # "post" | "wait" | "compute" | "drain"
    actions: tuple[Action, ...]
    label: str


@dataclass(frozen=True)
class Step:
    """One unlabelled program item and ``index``, where it sits in the list it was compiled
    from (after `receive_early`): its first action's position; a wait's is its consumer's,
    the drain's the list's length."""

    kind: str
    actions: tuple[Action, ...]
    index: int


def compile_steps(row: Sequence[Action], recv_lookahead: int = 0) -> list[Step]:
    """Group comm runs into ``post`` items and put a ``wait`` before each consumer of a
    received tensor. ``recv_lookahead`` != 0 posts receives earlier (`receive_early`: k > 0
    that many compute actions early, -1 all at the first wait); a batch is posted in the
    list's order."""
    row = receive_early(row, recv_lookahead)
    ends = dict(comm_batches(row))
    steps: list[Step] = []
    received: set[Action] = set()
    k = 0
    while k < len(row):
        if k in ends:
            batch = tuple(row[k : ends[k]])
            steps.append(Step("post", batch, k))
            received |= {a for a in batch if not a.op.is_send}
            k = ends[k]
            continue
        a = row[k]
        recv = input_receive(a)
        if recv is not None and recv in received:
            steps.append(Step("wait", (recv,), k))
        steps.append(Step("compute", (a,), k))
        k += 1
    steps.append(Step("drain", (), len(row)))
    return steps


def compile_program(row: Sequence[Action], stage_to_rank: Sequence[int] = (), recv_lookahead: int = 0) -> list[Item]:
    """`compile_steps` labelled: a wait names the rank it waits for, when ``stage_to_rank``
    is given."""

    def label(step: Step) -> str:
        if step.kind == "wait":
            recv = step.actions[0]
            src = f" from rank {peer_of(recv, stage_to_rank)[0]}" if stage_to_rank else ""
            return f"wait {recv}{src}"
        return "wait sends" if step.kind == "drain" else " ".join(map(str, step.actions))

    return [Item(s.kind, s.actions, label(s)) for s in compile_steps(row, recv_lookahead)]
