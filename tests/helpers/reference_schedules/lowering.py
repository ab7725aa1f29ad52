"""Insert the sends and receives a compute-only schedule implies.

A receive goes right before the compute that consumes it and a send right after the compute
that produces it, so consecutive communication actions form one batch that the runtime posts
with a single ``batch_isend_irecv`` (1F1B's send-forward/receive-backward pair among them).
Stages that live on the same rank hand tensors over locally and get no communication actions.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule


def add_comms(schedule: Schedule) -> Schedule:
    """Return ``schedule`` with SEND/RECV actions inserted; existing comm actions are dropped.

    Compute actions are taken in groups (``schedule.groups``, default one action per group):
    the receives a group needs go right before it, the sends it produces right after it, so
    the sends of one group and the receives of the next form one batch."""
    s2r = schedule.stage_to_rank

    def receives(group):
        return [rcv for a in group if (rcv := remote_input(a, s2r)) is not None]

    def sends(group):
        return [snd for a in group for snd in remote_outputs(a, s2r)]

    rows = []
    for r, row in enumerate(schedule.actions):
        compute = [a for a in row if a.op.is_compute]
        sizes = group_sizes(schedule, r, len(compute))
        groups, k = [], 0
        for n in sizes:
            groups.append(compute[k : k + n])
            k += n
        out: list[Action] = receives(groups[0]) if groups else []
        for j, group in enumerate(groups):
            out += group
            out += sends(group)
            if j + 1 < len(groups):
                out += receives(groups[j + 1])
        rows.append(out)
    return schedule.with_actions(rows)


def remote_input(a: Action, stage_to_rank) -> Action | None:
    """The receive compute ``a`` needs when its input comes from a stage on another rank."""
    recv = input_receive(a)
    if recv is None:
        return None
    src = a.stage - 1 if recv.op is Op.RECV_F else a.stage + 1
    return recv if 0 <= src < len(stage_to_rank) and stage_to_rank[src] != stage_to_rank[a.stage] else None


def remote_outputs(a: Action, stage_to_rank) -> list[Action]:
    """The sends compute ``a`` makes: its activation (F) or input gradient (B, I) when the
    stage that takes it lives on another rank."""
    if a.op is Op.F:
        send, dst = Op.SEND_F, a.stage + 1
    elif a.op in (Op.B, Op.I):
        send, dst = Op.SEND_B, a.stage - 1
    else:
        return []
    remote = 0 <= dst < len(stage_to_rank) and stage_to_rank[dst] != stage_to_rank[a.stage]
    return [Action(a.stage, send, a.mb)] if remote else []


def group_sizes(schedule: Schedule, rank: int, n: int) -> list[int]:
    """Sizes of the consecutive groups of rank ``rank``'s ``n`` compute actions whose comms go
    out together: ``schedule.groups``, else one per action and two per overlapped cell."""
    cells = schedule.cells(rank)
    if schedule.groups:
        sizes = list(schedule.groups[rank])
        if sum(sizes) != n:
            raise ValueError(f"rank {rank}: groups {sizes} do not cover its {n} compute actions")
        inside, k = set(), 0  # positions that continue a group
        for size in sizes:
            inside.update(range(k + 1, k + size))
            k += size
        if any(k + 1 not in inside for k in cells):
            raise ValueError(f"rank {rank}: an overlapped cell straddles two of the groups {sizes}")
        return sizes
    sizes, k = [], 0
    while k < n:
        sizes.append(2 if k in cells else 1)
        k += sizes[-1]
    return sizes


def peer_of(action: Action, stage_to_rank) -> tuple[int, Action]:
    """The (rank, action) at the other end of a communication action."""
    s, i = action.stage, action.mb
    if action.op is Op.SEND_F:
        return stage_to_rank[s + 1], Action(s + 1, Op.RECV_F, i)
    if action.op is Op.RECV_F:
        return stage_to_rank[s - 1], Action(s - 1, Op.SEND_F, i)
    if action.op is Op.SEND_B:
        return stage_to_rank[s - 1], Action(s - 1, Op.RECV_B, i)
    if action.op is Op.RECV_B:
        return stage_to_rank[s + 1], Action(s + 1, Op.SEND_B, i)
    raise ValueError(f"{action} is not a communication action")


_FED_BY = {Op.F: Op.RECV_F, Op.B: Op.RECV_B, Op.I: Op.RECV_B}


def input_receive(action: Action) -> Action | None:
    """The receive that would feed compute ``action`` when its input comes from another rank
    (F takes an activation, B and I a gradient; W and comm actions take none)."""
    op = _FED_BY.get(action.op)
    return None if op is None else Action(action.stage, op, action.mb)


def comm_batches(row) -> list[tuple[int, int]]:
    """Index ranges [start, end) of the maximal runs of consecutive comm actions in ``row``."""
    spans, start = [], None
    for k, a in enumerate(row):
        if a.op.is_comm and start is None:
            start = k
        elif not a.op.is_comm and start is not None:
            spans.append((start, k))
            start = None
    if start is not None:
        spans.append((start, len(row)))
    return spans


def receive_early(row: Sequence[Action], lookahead: int, cells: frozenset[int] = frozenset()) -> list[Action]:
    """``row`` with its receives posted earlier, keeping their order; waits stay before the
    consumers, so the blocking points are the lowered list's: only the posting moves.

    ``lookahead`` = k > 0: each receive moves k compute actions earlier (to the start of the
    row at most), ahead of the sends it lands next to. k < 0: every receive of the row is
    posted at once, after the sends that precede the rank's first wait, where the rank idles
    anyway (all of a step's receive buffers are then allocated together). ``cells``: compute
    indices starting an overlapped cell; no receive lands between its two actions.

    On gloo this matters: a send goes out only once its receive is posted (gloo's transport is
    rendezvous: a receive tells the sender it is ready), so a receive posted while the stage
    still computes lets the data land meanwhile, instead of starting a round trip when it
    ends; and a receive posted while the rank idles costs no time between two computes."""
    if lookahead == 0:
        return list(row)
    is_recv = [a.op.is_comm and not a.op.is_send for a in row]
    recvs = [a for a, r in zip(row, is_recv) if r]
    rest = [a for a, r in zip(row, is_recv) if not r]
    if not recvs:
        return list(row)
    computes = [k for k, a in enumerate(rest) if a.op.is_compute]
    inside = {computes[c + 1] for c in cells if c + 1 < len(computes)}  # a cell's backward: never in front of it
    if lookahead < 0:
        received = set(recvs)
        first = next(k for k, a in enumerate(rest) if input_receive(a) in received)
        first = computes[computes.index(first) - 1] if first in inside else first
        return rest[:first] + recvs + rest[first:]
    moved: dict[int, list[Action]] = {}  # index in ``rest`` -> receives posted before it
    seen = 0  # computes before the current receive in ``row``
    for a, r in zip(row, is_recv):
        if not r:
            seen += a.op.is_compute
            continue
        k = computes[max(seen - lookahead, 0)]
        if k in inside:
            k = computes[computes.index(k) - 1]
        while k > 0 and rest[k - 1].op.is_comm:  # ahead of the sends posted there
            k -= 1
        moved.setdefault(k, []).append(a)
    out: list[Action] = []
    for k, a in enumerate(rest):
        out += moved.get(k, [])
        out.append(a)
    return out
