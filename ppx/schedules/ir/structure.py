"""Whether a compute order passes `validate.check_structure` once Megatron's placement
(`lowering.add_comms`) adds its sends and receives, decided on whole arrays at once.

That placement puts every receive right before its consumer and every send right after its
producer, so its comm actions are always where `check_structure` wants them when the
computes are right: the check reduces to the computes'. Each stage's actions on its own
rank, microbatches in range, no action twice, every microbatch's forward on every stage
and, when training, one full backward B after it or an I after it and a W after that;
overlapped cells a forward and an adjacent backward of another microbatch. `place_comms`
asks this first and runs the full check, for its message, only when the answer is no.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ppx.schedules.ir.action import Op
from ppx.schedules.ir.codes import B, F, I, Rows
from ppx.schedules.ir.schedule import Schedule


def compute_order_ok(schedule: Schedule, rows: Rows) -> bool:
    """True when ``check_structure(add_comms(schedule))`` passes; ``rows``: ``schedule``'s
    compute actions, encoded (`codes.rows_of` of its `compute_only`)."""
    s2r, ranks, stages, m = schedule.stage_to_rank, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches
    if not s2r or any(not 0 <= r < ranks for r in s2r) or len(rows) != ranks:
        return False
    if not _cells_ok(schedule, rows):
        return False
    lengths = [len(oc) for _, oc, _ in rows]
    total = sum(lengths)
    if total == 0:
        return stages == 0 or m == 0
    st = np.fromiter(chain.from_iterable(r[0] for r in rows), np.int64, total)
    oc = np.fromiter(chain.from_iterable(r[1] for r in rows), np.int64, total)
    mb = np.fromiter(chain.from_iterable(r[2] for r in rows), np.int64, total)
    if st.min() < 0 or st.max() >= stages or mb.min() < 0 or mb.max() >= m:
        return False
    rank = np.repeat(np.arange(ranks), lengths)
    if (np.asarray(s2r)[st] != rank).any():
        return False
    pos = np.arange(total) - np.repeat(np.cumsum([0] + lengths[:-1]), lengths)  # position in its row
    code = (st * m + mb) * 4 + oc
    if (np.bincount(code, minlength=4 * stages * m) > 1).any():
        return False
    at = np.full(4 * stages * m, -1, np.int64)
    at[code] = pos
    f, b, i, w = at.reshape(stages * m, 4).T  # per (stage, microbatch): where each op is, or -1
    if (f < 0).any():
        return False
    if not schedule.training:
        return bool((b < 0).all() and (i < 0).all() and (w < 0).all())
    full = (b > f) & (i < 0) & (w < 0)
    split = (b < 0) & (i > f) & (w > i)
    return bool((full | split).all())


def _cells_ok(schedule: Schedule, rows: Rows) -> bool:
    """Each overlapped cell a forward then a backward (B or I) of another (stage, microbatch),
    the next compute action, itself starting no cell."""
    if schedule.overlaps is None:
        return True
    if len(schedule.overlaps) != schedule.num_ranks:
        return False
    for r, (st, oc, mb) in enumerate(rows):
        cells = schedule.cells(r)
        for c in cells:
            if c < 0 or c + 1 >= len(oc) or c + 1 in cells:
                return False
            if oc[c] != F or oc[c + 1] not in (B, I) or (st[c], mb[c]) == (st[c + 1], mb[c + 1]):
                return False
    return True


def whole_backward_stages(schedule: Schedule, rank: int) -> set[int]:
    """The stages of ``rank`` whose every I is followed at once by its own W, with nothing
    between them but receives posted: the I's gradient goes nowhere before the W has run (no
    send between them), so running the whole backward in the I, and nothing in the W, keeps
    every action where the order puts it and the step's critical path as it was (a receive
    posted between them is posted after the whole backward instead: on NCCL's stream, or with
    a receive lookahead >= 0, a little later). The first stage in ZB-H1, ZB-H2, ZB-V and
    interleaved zero bubble; ZB-V's stage p too where m <= p (its gradient stays on its rank).
    None on a rank with overlapped cells."""
    row = schedule.actions[rank]
    if schedule.cells(rank):
        return set()
    whole = {a.stage for a in row if a.op is Op.I}
    for j, a in enumerate(row):
        if a.op is not Op.I or a.stage not in whole:
            continue
        k = j + 1
        while k < len(row) and row[k].op in (Op.RECV_F, Op.RECV_B):
            k += 1
        if k == len(row) or (row[k].op, row[k].stage, row[k].mb) != (Op.W, a.stage, a.mb):
            whole.discard(a.stage)
    return whole


def whole_stages_of(schedule: Schedule) -> set[int]:
    """`whole_backward_stages` over every rank: the stages ppx's runtime runs whole under
    ``train.split_backward=auto``."""
    return set(chain.from_iterable(whole_backward_stages(schedule, r) for r in range(schedule.num_ranks)))


def split_stages(schedule: Schedule) -> set[int]:
    """The stages ``schedule`` runs a W on (a backward split into an I and a W)."""
    return {a.stage for row in schedule.actions for a in row if a.op is Op.W}


def split_apart(schedule: Schedule, stages) -> list[int]:
    """Those of ``stages`` that ``schedule`` splits into an I and a W it does not run whole
    (`whole_backward_stages`): where a run that ran them whole measured no I and W apart."""
    return sorted(split_stages(schedule) & set(stages) - whole_stages_of(schedule))


def same_compute(x: Schedule, y: Schedule) -> bool:
    """Whether ``x`` and ``y`` run the same compute actions in the same order on the same ranks
    (wherever their lists place sends and receives)."""
    return x.compute_only().actions == y.compute_only().actions and list(x.stage_to_rank) == list(y.stage_to_rank)


def drain_only(schedule: Schedule) -> Schedule:
    """``schedule`` splitting a backward only where its W can fill the drain
    (``train.split_backward=drain``): on each rank, a microbatch's I becomes one whole B, at
    the I's place, and its W goes, unless the rank runs that W after the stage's last forward.
    A W before it only moves the rest of the stage's work later, while storing for the split
    costs every microbatch it splits (llama-tiny fp32 at p=2, step by step beside 1F1B over
    five A/B rounds: ZB-H1 a median 1.024 of 1F1B's step, this list 0.994). Ranks with
    overlapped cells are left as they are (a cell's backward keeps its I)."""
    if not schedule.splits_backward:
        return schedule
    rows = []
    for r, row in enumerate(schedule.actions):
        if schedule.cells(r) or not any(a.op is Op.I for a in row):
            rows.append(row)
            continue
        last_f = {a.stage: j for j, a in enumerate(row) if a.op is Op.F}
        split = {(a.stage, a.mb) for j, a in enumerate(row) if a.op is Op.W and j > last_f.get(a.stage, -1)}
        out = []
        for a in row:
            if a.op is Op.I and (a.stage, a.mb) not in split:
                out.append(a._replace(op=Op.B))
            elif a.op is not Op.W or (a.stage, a.mb) in split:
                out.append(a)
        rows.append(tuple(out))
    return schedule.with_actions(rows)


def drain_keeps(schedule: Schedule) -> str:
    """Why `drain_only` leaves ``schedule`` as built (where it does): every W already follows its
    stage's last forward, or sits on a rank that overlaps forwards with backwards (cells)."""
    if any(schedule.cells(r) for r in range(schedule.num_ranks)):
        return "each W follows its stage's last forward or sits on a rank of overlapped cells (a cell keeps its I)"
    return "every W follows its stage's last forward"
