"""Check an action list before it runs; errors name the rank, the step and the action."""

from __future__ import annotations

from collections import Counter, defaultdict

from helpers.reference_schedules.lowering import peer_of
from helpers.reference_schedules.simulate import Timeline, simulate
from ppx.errors import ScheduleError
from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.sim.costs import Costs


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
                _check_comm_position(r, k, a, row, schedule)
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


def _check_comm_position(r, k, a, row, schedule):
    s, i = a.stage, a.mb
    s2r, last = schedule.stage_to_rank, schedule.num_stages - 1
    nxt = {Op.SEND_F: s + 1, Op.RECV_F: s - 1, Op.SEND_B: s - 1, Op.RECV_B: s + 1}[a.op]
    if not 0 <= nxt <= last or s2r[nxt] == r:
        raise ScheduleError(f"{_where(r, k, a)}: stage {s} has no remote peer stage {nxt} to talk to")
    if a.op in (Op.SEND_B, Op.RECV_B) and not schedule.training:
        raise ScheduleError(f"{_where(r, k, a)}: a forward-only schedule sends no gradients")
    before, after = row[:k], row[k + 1 :]
    if a.op is Op.SEND_F and Action(s, Op.F, i) not in before:
        raise ScheduleError(f"{_where(r, k, a)}: sends before {s}F{i} has produced it")
    if a.op is Op.RECV_F and Action(s, Op.F, i) not in after:
        raise ScheduleError(f"{_where(r, k, a)}: no later {s}F{i} consumes it")
    grads = (Action(s, Op.B, i), Action(s, Op.I, i))
    if a.op is Op.SEND_B and not any(g in before for g in grads):
        raise ScheduleError(f"{_where(r, k, a)}: sends before {s}B{i} (or {s}I{i}) has produced it")
    if a.op is Op.RECV_B and not any(g in after for g in grads):
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
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, row in enumerate(schedule.actions):
        for k, a in enumerate(row):
            if a.op.is_comm:
                peer, other = peer_of(a, schedule.stage_to_rank)
                kind = a.op in (Op.SEND_B, Op.RECV_B) if by_kind else None
                if a.op.is_send:
                    sends[(r, peer, kind)].append((a, other, k))
                else:
                    recvs[(peer, r, kind)].append((other, a, k))
    for (src, dst, kind), sent in sends.items():
        got = recvs.get((src, dst, kind), [])
        for (snd, want, k), (_, rcv, k2) in zip(sent, got):
            if want != rcv:
                try:
                    if want.op is rcv.op:
                        simulate(schedule, transport="gloo" if by_kind else "nccl")
                except ScheduleError as e:
                    if str(e).startswith("schedule deadlocks"):
                        raise ScheduleError(str(e)) from None
                raise ScheduleError(
                    f"rank {src} step {k} ({snd}) is matched by rank {dst} step {k2} ({rcv}): "
                    f"sends and receives between ranks {src} and {dst} are in a different order"
                )
