"""A rank's action list compiled into a program of items, the form both the runtime and
the simulator execute:
  ``post``    one batch of consecutive SEND/RECV actions, posted together;
  ``wait``    block until a received tensor has arrived (inserted before its consumer);
  ``compute`` F, B, I or W of one microbatch on one stage (an overlapped cell is two compute
              items, its forward then its backward, marked ``overlap`` 1 and 2, after the
              waits for both inputs);
  ``reduce``  (data parallel only) reduce a stage's gradients across the pipeline replicas,
              after its last backward and that backward's gradient send;
  ``drain``   end of step: wait until every send has completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from helpers.reference_schedules.lowering import comm_batches, input_receive, peer_of, receive_early
from ppx.schedules.ir.action import Action, Op


@dataclass(frozen=True)
class Item:
    """One program item; ``label`` names it in timelines and error messages."""

    kind: str  # "post" | "wait" | "compute" | "reduce" | "drain"
    actions: tuple[Action, ...]
    label: str
    overlap: int = 0  # compute: 1 / 2 for an overlapped cell's forward / backward, else 0


@dataclass(frozen=True)
class Step:
    """One unlabelled program item and ``index``, where it sits in the list it was compiled
    from (after `receive_early`): its first action's position; a wait's is its consumer's,
    the drain's the list's length."""

    kind: str
    actions: tuple[Action, ...]
    index: int
    overlap: int = 0  # as `Item.overlap`


def compile_steps(row: Sequence[Action], recv_lookahead: int = 0, cells: frozenset[int] = frozenset()) -> list[Step]:
    """Group comm runs into ``post`` items and put a ``wait`` before each consumer of a
    received tensor. ``recv_lookahead`` != 0 posts receives earlier (`receive_early`: k > 0
    that many compute actions early, -1 all at the first wait); a batch is posted in the
    list's order. ``cells``: the compute indices that start an overlapped cell (its two
    actions adjacent in ``row``), whose inputs are both awaited before it starts."""
    row = receive_early(row, recv_lookahead, cells)
    ends = dict(comm_batches(row))
    steps: list[Step] = []
    received: set[Action] = set()
    k = n = 0  # position in row, compute actions so far
    while k < len(row):
        if k in ends:
            batch = tuple(row[k : ends[k]])
            steps.append(Step("post", batch, k))
            received |= {a for a in batch if not a.op.is_send}
            k = ends[k]
            continue
        unit = row[k : k + 2] if n in cells else row[k : k + 1]
        for a in unit:
            recv = input_receive(a)
            if recv is not None and recv in received:
                steps.append(Step("wait", (recv,), k))
        for j, a in enumerate(unit):
            steps.append(Step("compute", (a,), k + j, j + 1 if len(unit) == 2 else 0))
        k, n = k + len(unit), n + len(unit)
    steps.append(Step("drain", (), len(row)))
    return steps


def with_reductions(steps: list[Step]) -> list[Step]:
    """``steps`` with one ``reduce`` step per stage that has a backward, right after its last
    backward (B, I or W) and after the post carrying that stage's last gradient send, so
    no peer waits for it (torch's REDUCE_GRAD placement). Its action is the stage's last
    backward."""
    last: dict[int, tuple[int, Action]] = {}  # stage -> (position after which it reduces, last backward)
    for j, st in enumerate(steps):
        for a in st.actions:
            if st.kind == "compute" and a.op.is_backward:
                last[a.stage] = (j, a)
            elif st.kind == "post" and a.op is Op.SEND_B and a.stage in last:
                last[a.stage] = (j, last[a.stage][1])
    after: dict[int, list[Step]] = {}
    for _, (j, a) in sorted(last.items()):
        after.setdefault(j, []).append(Step("reduce", (a,), steps[j].index))
    return [x for j, st in enumerate(steps) for x in (st, *after.get(j, ()))]


def compile_program(
    row: Sequence[Action],
    stage_to_rank: Sequence[int] = (),
    recv_lookahead: int = 0,
    cells: frozenset[int] = frozenset(),
    reduce: bool = False,
) -> list[Item]:
    """`compile_steps` labelled: a wait names the rank it waits for, when ``stage_to_rank``
    is given; ``reduce`` adds the data-parallel reductions (`with_reductions`)."""

    def label(step: Step) -> str:
        if step.kind == "wait":
            recv = step.actions[0]
            src = f" from rank {peer_of(recv, stage_to_rank)[0]}" if stage_to_rank else ""
            return f"wait {recv}{src}"
        if step.kind == "reduce":
            return f"{step.actions[0].stage}REDUCE_GRAD"
        return "wait sends" if step.kind == "drain" else " ".join(map(str, step.actions))

    steps = compile_steps(row, recv_lookahead, cells)
    if reduce:
        steps = with_reductions(steps)
    return [Item(s.kind, s.actions, label(s), s.overlap) for s in steps]
