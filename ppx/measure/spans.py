"""Timing spans: what one program item took on one rank, and the one map from item kinds to
the time categories every report uses (compute, comm, dp_comm, wait).

A `Span` is one item's ``kind``, ``label`` and ``actions`` with its ``start_s``/``end_s``;
spans are kept per rank and step, with times on rank 0's clock once the engine has shifted
them (`Span.shifted`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from ppx.schedules.comms.lowering import peer_of
from ppx.schedules.ir.action import Action

COMPUTE, COMM, DP_COMM, WAIT = "compute", "comm", "dp_comm", "wait"
# item kind -> time category; dp_comm: the data-parallel gradient reduction (parallel.data > 1)
CATEGORY = {"compute": COMPUTE, "post": COMM, "reduce": DP_COMM, "wait": WAIT, "drain": WAIT}


@dataclass(frozen=True)
class Span:
    """One program item's time on one rank: ``kind`` is "post" | "wait" | "compute" | "drain" | "reduce"
    (as `ppx.schedules.comms.program.Item`), ``actions`` the item's actions (a compute span has one,
    a wait the receive it waits for, a post its batch of sends and receives, a reduce the
    stage's last backward)."""

    kind: str
    label: str
    actions: tuple[Action, ...]
    start_s: float
    end_s: float

    @classmethod
    def of(cls, item, start_s: float, end_s: float) -> Span:
        """The span of a program item (anything with ``kind``, ``label`` and ``actions``)."""
        return cls(item.kind, item.label, tuple(item.actions), start_s, end_s)

    @property
    def category(self) -> str:
        """compute, comm, dp_comm or wait (`CATEGORY`)."""
        return CATEGORY[self.kind]

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def action(self) -> Action:
        """The span's first action: a compute span's action, a wait's receive."""
        return self.actions[0]

    def shifted(self, offset_s: float) -> Span:
        """The same span with both times moved by ``offset_s`` (onto rank 0's clock)."""
        return replace(self, start_s=self.start_s + offset_s, end_s=self.end_s + offset_s)


@dataclass(frozen=True)
class Handoff:
    """A send whose receive was waited on: the send, the sender's rank and the start of its
    post, the receiving rank and its wait."""

    send: Action
    rank: int
    posted_s: float
    peer: int
    wait_start_s: float
    wait_end_s: float


def handoffs(step_ranks: Mapping[int, Iterable[Span]], stage_to_rank) -> Iterator[Handoff]:
    """Every send in one step's spans (``{rank: [Span, ...]}``) whose receive was waited on."""
    waits = {(r, sp.action): sp for r, spans in step_ranks.items() for sp in spans if sp.kind == "wait"}
    for r, spans in step_ranks.items():
        for sp in spans:
            if sp.kind != "post":
                continue
            for a in sp.actions:
                if a.op.is_send:
                    peer, recv = peer_of(a, stage_to_rank)
                    got = waits.get((peer, recv))
                    if got is not None:
                        yield Handoff(a, r, sp.start_s, peer, got.start_s, got.end_s)


def first_timeline_step(cfg) -> int:
    """The first step whose spans the run's timeline (and its measured costs) keep: the last
    ``instrument.timeline_steps`` steps; ``train.steps`` (none) with ``instrument.timeline`` off.
    (Here, without torch: ``ppx simulate --from-run`` and ``ppx plan --from-run`` read it.)"""
    ins = cfg.instrument
    return cfg.train.steps - ins.timeline_steps if ins.timeline else cfg.train.steps
