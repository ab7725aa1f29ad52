"""Timing spans: what one program item took on one rank, and the one map from item kinds to
the time categories every report uses (compute, comm, wait).

Spans are ``(kind, label, actions, start_s, end_s)`` per rank and step, with times on rank
0's clock."""

from __future__ import annotations

from ppx.schedules.action import Action
from ppx.schedules.lowering import peer_of

COMPUTE, COMM, WAIT = "compute", "comm", "wait"
CATEGORY = {"compute": COMPUTE, "post": COMM, "wait": WAIT, "drain": WAIT}  # item kind -> time category


def handoffs(step_ranks: dict, stage_to_rank):
    """Every send in one step's spans whose receive was waited on, as
    (send action text, sender rank, post start, receiver rank, wait start, wait end)."""
    waits = {(r, sp[2][0]): (sp[3], sp[4]) for r, spans in step_ranks.items() for sp in spans if sp[0] == "wait"}
    for r, spans in step_ranks.items():
        for kind, _, actions, start, _ in spans:
            if kind != "post":
                continue
            for text in actions:
                a = Action.parse(text)
                if a.op.is_send:
                    peer, recv = peer_of(a, stage_to_rank)
                    got = waits.get((peer, str(recv)))
                    if got is not None:
                        yield text, r, start, peer, got[0], got[1]
