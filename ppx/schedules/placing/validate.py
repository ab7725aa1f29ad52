"""Check an action list before it runs; errors name the rank, the step and the action.

Linear in the actions: each rank's first and last position of every action is looked up
instead of searched for, and the channels are read from the compiled program
(`ppx.schedules.sim.compiled`) the dry run then runs."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from ppx.errors import ScheduleError
from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.codes import KEY_BASE, RECV_B, SEND_B, SEND_F, SPAN, text
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.sim.compiled import Compiled
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.simulate import Timeline, program_of, simulate


def _where(r: int, k: int, a: Action) -> str:
    return f"rank {r} step {k} ({a})"


def validate(schedule: Schedule, transport: str = "nccl") -> None:
    """Raise ScheduleError unless ``schedule`` (with comm actions) is complete and runs under
    ``transport`` ("nccl", the strict one, or "gloo"): `check_structure`, then `check_runs`."""
    check_structure(schedule)
    check_runs(schedule, transport)


def check_structure(schedule: Schedule) -> None:
    """Every stage lives on the rank that runs its actions; each stage runs F exactly once per
    microbatch and, for training, exactly one full backward B or one I and one W; F comes
    before the backward of the same microbatch, I before W; every cross-rank hand-off has its
    send after the producer and its receive before the consumer."""
    s2r, m = schedule.stage_to_rank, schedule.num_microbatches
    if not s2r or any(not 0 <= r < schedule.num_ranks for r in s2r):
        raise ScheduleError(f"stage_to_rank {list(s2r)} must map every stage to one of {schedule.num_ranks} ranks")
    last = schedule.num_stages - 1
    seen: dict[tuple[int, int], dict[Op, tuple[int, int]]] = defaultdict(dict)  # (stage, mb) -> op -> (rank, step)
    for r, row in enumerate(schedule.actions):
        counts = Counter(row)
        first: dict[Action, int] = {}  # each action's first and last position in the row
        last_at: dict[Action, int] = {}
        for k, a in enumerate(row):
            first.setdefault(a, k)
            last_at[a] = k
        for k, a in enumerate(row):
            if not 0 <= a.stage <= last:
                raise ScheduleError(f"{_where(r, k, a)}: stage {a.stage} does not exist ({last + 1} stages)")
            if s2r[a.stage] != r:
                raise ScheduleError(f"{_where(r, k, a)}: stage {a.stage} belongs to rank {s2r[a.stage]}")
            if not 0 <= a.mb < m:
                raise ScheduleError(f"{_where(r, k, a)}: microbatch {a.mb} out of range 0..{m - 1}")
            if counts[a] > 1:
                raise ScheduleError(f"{_where(r, k, a)}: {a} appears {counts[a]} times")
            if a.op.is_compute:
                _check_compute_order(r, k, a, seen, schedule.training)
            else:
                _check_comm_position(r, k, a, first, last_at, schedule)
            seen[(a.stage, a.mb)][a.op] = (r, k)
    _check_complete(schedule, seen)
    _check_cells(schedule)


def _check_cells(schedule: Schedule) -> None:
    """An overlapped cell is a forward then, adjacent to it, a backward (B or I) that does not
    need that forward; cells do not share actions."""
    if schedule.overlaps is not None and len(schedule.overlaps) != schedule.num_ranks:
        raise ScheduleError(
            f"overlapped cells given for {len(schedule.overlaps)} ranks, the schedule has {schedule.num_ranks}"
        )
    for r, row in enumerate(schedule.actions):
        where = [k for k, a in enumerate(row) if a.op.is_compute]  # compute index -> position in row
        for c in sorted(schedule.cells(r)):
            if c + 1 >= len(where) or c + 1 in schedule.cells(r):
                raise ScheduleError(f"rank {r}: overlapped cell at compute action {c} has no backward of its own")
            k, k2 = where[c], where[c + 1]
            f, b = row[k], row[k2]
            if f.op is not Op.F or b.op not in (Op.B, Op.I):
                raise ScheduleError(
                    f"{_where(r, k, f)}: an overlapped cell is a forward then a backward, not {f} and {b}"
                )
            if k2 != k + 1:
                raise ScheduleError(
                    f"{_where(r, k, f)}: an overlapped cell's {f} and {b} must be adjacent, {row[k + 1]} sits between"
                )
            if (b.stage, b.mb) == (f.stage, f.mb):
                raise ScheduleError(f"{_where(r, k, f)}: an overlapped cell cannot hold {b}, which needs {f}'s output")


def check_runs(schedule: Schedule, transport: str = "nccl", costs: Costs | None = None) -> Timeline:
    """Sends and receives pair up in the same order on every channel the transport matches
    in order (NCCL: each pair of ranks; gloo: each pair and kind, activations and gradients
    travelling on groups of their own), and a dry run under ``transport`` cannot deadlock
    (whatever the costs: a deadlock is a cycle of waits). Returns that dry run's timeline,
    at ``costs`` (default `Costs()`)."""
    _check_channels(schedule, by_kind=transport == "gloo")
    return simulate(schedule, costs, transport)


def _check_compute_order(r, k, a, seen, training):
    done = seen[(a.stage, a.mb)]
    if a.op.is_backward and not training:
        raise ScheduleError(f"{_where(r, k, a)}: a forward-only schedule has no backward")
    if a.op.is_backward and Op.F not in done:
        raise ScheduleError(f"{_where(r, k, a)}: backward before its forward {a.stage}F{a.mb}")
    if a.op is Op.W and Op.I not in done:
        raise ScheduleError(f"{_where(r, k, a)}: weight gradient before its input gradient {a.stage}I{a.mb}")
    if a.op is Op.I and Op.B in done or a.op is Op.B and Op.I in done:
        raise ScheduleError(f"{_where(r, k, a)}: mixes a full backward B with a split backward I/W")


def _check_comm_position(r, k, a, first, last_at, schedule):
    """A send after its producer, a receive before its consumer (``first``/``last_at``: each
    action's first and last position in the row)."""
    s, i = a.stage, a.mb
    s2r, last = schedule.stage_to_rank, schedule.num_stages - 1
    nxt = {Op.SEND_F: s + 1, Op.RECV_F: s - 1, Op.SEND_B: s - 1, Op.RECV_B: s + 1}[a.op]
    if not 0 <= nxt <= last or s2r[nxt] == r:
        raise ScheduleError(f"{_where(r, k, a)}: stage {s} has no remote peer stage {nxt} to talk to")
    if a.op in (Op.SEND_B, Op.RECV_B) and not schedule.training:
        raise ScheduleError(f"{_where(r, k, a)}: a forward-only schedule sends no gradients")

    def before(x):
        return first.get(x, k) < k

    def after(x):
        return last_at.get(x, k) > k

    if a.op is Op.SEND_F and not before(Action(s, Op.F, i)):
        raise ScheduleError(f"{_where(r, k, a)}: sends before {s}F{i} has produced it")
    if a.op is Op.RECV_F and not after(Action(s, Op.F, i)):
        raise ScheduleError(f"{_where(r, k, a)}: no later {s}F{i} consumes it")
    grads = (Action(s, Op.B, i), Action(s, Op.I, i))
    if a.op is Op.SEND_B and not any(before(g) for g in grads):
        raise ScheduleError(f"{_where(r, k, a)}: sends before {s}B{i} (or {s}I{i}) has produced it")
    if a.op is Op.RECV_B and not any(after(g) for g in grads):
        raise ScheduleError(f"{_where(r, k, a)}: no later {s}B{i} (or {s}I{i}) consumes it")


def _check_complete(schedule: Schedule, seen) -> None:
    s2r, last = schedule.stage_to_rank, schedule.num_stages - 1
    for s in range(last + 1):
        r = s2r[s]
        for i in range(schedule.num_microbatches):
            done = seen[(s, i)]
            if Op.F not in done:
                raise ScheduleError(f"rank {r}: stage {s} never runs forward {s}F{i}")
            if schedule.training and Op.B not in done and not (Op.I in done and Op.W in done):
                raise ScheduleError(f"rank {r}: stage {s} never runs the backward of microbatch {i} ({s}B{i})")
            needs = []
            if s > 0 and s2r[s - 1] != r:
                needs.append(Action(s, Op.RECV_F, i))
            if s < last and s2r[s + 1] != r:
                needs.append(Action(s, Op.SEND_F, i))
            if schedule.training and s > 0 and s2r[s - 1] != r:
                needs.append(Action(s, Op.SEND_B, i))
            if schedule.training and s < last and s2r[s + 1] != r:
                needs.append(Action(s, Op.RECV_B, i))
            for need in needs:
                if need.op not in done:
                    raise ScheduleError(
                        f"rank {r}: {need} is missing (stage {s} exchanges microbatch {i} with another rank)"
                    )


def _check_channels(schedule: Schedule, by_kind: bool = False) -> None:
    """Sends from a to b must appear in the same order as b's receives from a (NCCL has no
    tags); ``by_kind``: per kind of message instead (gloo's two groups, activations and
    gradients). A mismatch within one kind of message comes from computes run in another
    order than the peer's (a swap of two forwards, their sends and receives moved with them):
    when the dry run, every message matched to its own receive, deadlocks on it, that
    deadlock is reported, naming what waits for what, rather than the order mismatch."""
    prog = program_of(schedule)[0]
    got = channel_mismatch(prog, schedule.stage_to_rank, by_kind)
    if got is None:
        return
    src, dst, o, q = got
    if prog.o_code[o] == prog.o_code[q] - 1:  # the same kind of message: a send and a receive of it
        try:
            simulate(schedule, transport="gloo" if by_kind else "nccl")
        except ScheduleError as e:
            if str(e).startswith("schedule deadlocks"):
                raise ScheduleError(str(e)) from None
    raise ScheduleError(
        f"rank {src} step {prog.o_index[o]} ({_op(prog, o)}) is matched by rank {dst} step {prog.o_index[q]} "
        f"({_op(prog, q)}): sends and receives between ranks {src} and {dst} are in a different order"
    )


def channel_mismatch(prog: Compiled, stage_to_rank, by_kind: bool = False) -> tuple[int, int, int, int] | None:
    """The first send whose channel's receive in the same place is another message's:
    (sending rank, receiving rank, send op, receive op), channels in the order their first
    send appears, rank by rank; None when every channel's order agrees. On whole arrays:
    each op's channel and its place in it, sends and receives matched by both."""
    code = np.asarray(prog.o_code, np.int64)
    stage = np.asarray(prog.o_stage, np.int64)
    rank = np.asarray(prog.o_rank, np.int64)
    s2r = np.asarray(stage_to_rank, np.int64)
    peer = s2r[np.where((code == SEND_F) | (code == RECV_B), stage + 1, stage - 1)]
    send = (code == SEND_F) | (code == SEND_B)
    kind = (code >= SEND_B) if by_kind else np.zeros(len(code), bool)
    ranks = len(prog.kinds)
    channel = (np.where(send, rank, peer) * ranks + np.where(send, peer, rank)) * 2 + kind
    keys = (2 * stage + np.asarray(KEY_BASE, np.int64)[code]) * SPAN + np.asarray(prog.o_mb, np.int64)
    sends, recvs = np.flatnonzero(send), np.flatnonzero(~send)
    if not len(sends) or not len(recvs):
        return None
    s_ord = sends[np.argsort(channel[sends], kind="stable")]  # each channel's sends in order
    r_ord = recvs[np.argsort(channel[recvs], kind="stable")]
    s_ch, r_ch = channel[s_ord], channel[r_ord]
    s_seq = np.arange(len(s_ord)) - np.searchsorted(s_ch, s_ch)  # place within its channel
    r_seq = np.arange(len(r_ord)) - np.searchsorted(r_ch, r_ch)
    width = len(code) + 1
    r_at = r_ch * width + r_seq
    at = np.minimum(np.searchsorted(r_at, s_ch * width + s_seq), len(r_at) - 1)
    paired = r_at[at] == s_ch * width + s_seq
    wrong = np.flatnonzero(paired & (keys[r_ord[at]] != keys[s_ord]))
    if not len(wrong):
        return None
    first_send = s_ord[np.searchsorted(s_ch, s_ch)]  # the op opening each send's channel
    pick = wrong[np.lexsort((s_seq[wrong], first_send[wrong]))[0]]
    o, q = int(s_ord[pick]), int(r_ord[at[pick]])
    return prog.o_rank[o], prog.o_rank[q], o, q


def _op(prog: Compiled, o: int) -> str:
    return text(prog.o_stage[o], prog.o_code[o], prog.o_mb[o])
