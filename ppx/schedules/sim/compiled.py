"""Every rank's row compiled at once into the integer program the simulator runs.

The items are `ppx.schedules.comms.program`'s (a ``post`` of one batch of consecutive sends and
receives, a ``wait`` before each consumer of a received tensor, ``compute``, ``reduce``,
``drain``), here as two parallel integer lists per rank: the kind and its argument (a batch,
an op, a compute, a stage). Sends and receives are numbered once, rank by rank (ops), each
paired with its peer through its message key; computes and batches likewise, so the
simulator keeps its state in flat lists indexed by those numbers instead of objects.
"""

from __future__ import annotations

import numpy as np

from ppx.schedules.ir.codes import COMM, IS_BACKWARD, KEY_BASE, SEND_B, SPAN, Rows, text

POST, WAIT, COMPUTE, REDUCE, DRAIN = range(5)


class Compiled:
    """The programs of every rank and the numbered computes, ops and batches they use."""

    def __init__(self, n: int):
        self.kinds: list[list[int]] = [[] for _ in range(n)]
        self.args: list[list[int]] = [[] for _ in range(n)]
        self.index: list[list[int]] = [[] for _ in range(n)]  # each item's position in the row
        self.c_first = [0] * (n + 1)  # rank r's computes are c_first[r]..c_first[r+1]-1
        self.c_stage, self.c_code, self.c_mb, self.c_pos = [], [], [], []
        self.c_key: list[int] = []  # stage * 8 + op code: what fixed costs depend on
        self.b_first = [0] * (n + 1)  # rank r's batches are b_first[r]..b_first[r+1]-1
        self.b_ops: list[int] = [0]  # batch b's ops are b_ops[b]..b_ops[b+1]-1
        self.b_size: list[int] = []  # each batch's number of ops
        self.b_head: list[int] = []  # the first batch of each batch's rank
        self.o_rank, self.o_index, self.o_stage, self.o_code, self.o_mb = [], [], [], [], []
        self.o_batch: list[int] = []
        self.o_peer: list[int] = []
        self.r_stage: list[int] = []  # each reduce's stage (`add_reductions`)
        self.missing = -1  # the first op without a peer, or -1


def compile_rows(rows: Rows, cells=()) -> Compiled:
    """``rows`` (per rank, encoded, receives already where they are posted) compiled and
    paired. ``cells[r]``: rank r's overlapped cells (compute indices), as `Schedule.cells`;
    a cell's two computes are adjacent (validated)."""
    out = Compiled(len(rows))
    keys = []  # each rank's ops' message keys
    for r, (st, oc, mb) in enumerate(rows):
        keys.append(_compile_rank(out, r, st, oc, mb, cells[r] if cells else ()))
        out.c_first[r + 1], out.b_first[r + 1] = len(out.c_stage), len(out.b_ops) - 1
    _pair(out, np.concatenate(keys) if keys else np.zeros(0, np.int64))
    return out


_KEY_BASE = np.array(KEY_BASE, np.int64)
_HAS_INPUT = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)  # F, B and I take a tensor from a neighbour


def _compile_rank(out: Compiled, r: int, st, oc, mb, cells) -> np.ndarray:
    """Rank ``r``'s program, laid out on whole arrays: each row position holds its items (a
    batch's first comm its post; a compute its waits, then itself; a cell's first compute the
    waits of both), in row order, then the drain. Returns its ops' message keys."""
    length = len(oc)
    st, oc, mb = (np.fromiter(x, np.int64, length) for x in (st, oc, mb))
    comm = oc >= COMM
    o_pos = np.flatnonzero(comm)
    c_pos = np.flatnonzero(~comm)
    ops0, batches0 = len(out.o_rank), len(out.b_ops) - 1
    first_op = np.ones(len(o_pos), bool)  # the op opens a batch: not right after another
    first_op[1:] = o_pos[1:] != o_pos[:-1] + 1
    o_batch = np.cumsum(first_op) - 1 + batches0
    keys = (2 * st + _KEY_BASE[oc]) * SPAN + mb
    o_key = keys[o_pos]
    # a compute waits when the receive carrying its input was posted earlier in the row
    recv = np.flatnonzero((oc[o_pos] == COMM + 1) | (oc[o_pos] == COMM + 3))
    order = np.argsort(o_key[recv], kind="stable")
    recv_keys, recv_ops = o_key[recv][order], recv[order]
    wants = _HAS_INPUT[oc[c_pos]]
    at = np.minimum(np.searchsorted(recv_keys, keys[c_pos]), max(len(recv_keys) - 1, 0))
    found = wants & (len(recv_keys) > 0)
    if len(recv_keys):
        found &= recv_keys[at] == keys[c_pos]
        found &= o_pos[recv_ops[at]] < c_pos
    wait_op = np.where(found, recv_ops[at] if len(recv_keys) else 0, -1) + ops0
    waits = found.astype(np.int64)
    lead = np.array(sorted(c for c in cells if 0 <= c < len(c_pos) - 1), np.int64)  # cells' first computes
    here = waits.copy()  # waits laid out at each compute's position: a cell's at its first
    here[lead] += waits[lead + 1]
    here[lead + 1] -= waits[lead + 1]
    count = np.zeros(length + 1, np.int64)
    count[o_pos[first_op]] = 1
    count[c_pos] = here + 1
    count[length] = 1  # the drain
    starts = np.cumsum(count) - count
    total = int(count.sum())
    kinds = np.full(total, DRAIN, np.int64)
    args = np.zeros(total, np.int64)
    kinds[starts[o_pos[first_op]]] = POST
    args[starts[o_pos[first_op]]] = o_batch[first_op]
    slot = starts[c_pos] + here  # the compute itself, after its position's waits
    kinds[slot] = COMPUTE
    args[slot] = np.arange(len(c_pos)) + len(out.c_stage)
    second = np.zeros(len(c_pos), bool)  # a cell's second compute: its wait at the cell's first
    second[lead + 1] = True
    wait_at = np.where(second, starts[c_pos - 1] + waits[np.maximum(np.arange(len(c_pos)) - 1, 0)], starts[c_pos])
    kinds[wait_at[found]] = WAIT
    args[wait_at[found]] = wait_op[found]
    out.kinds[r], out.args[r] = kinds.tolist(), args.tolist()
    out.index[r] = np.repeat(np.arange(length + 1), count).tolist()
    out.c_stage += st[c_pos].tolist()
    out.c_code += oc[c_pos].tolist()
    out.c_mb += mb[c_pos].tolist()
    out.c_pos += c_pos.tolist()
    out.c_key += (st[c_pos] * 8 + oc[c_pos]).tolist()
    out.o_rank += [r] * len(o_pos)
    out.o_index += o_pos.tolist()
    out.o_stage += st[o_pos].tolist()
    out.o_code += oc[o_pos].tolist()
    out.o_mb += mb[o_pos].tolist()
    out.o_batch += o_batch.tolist()
    out.b_ops += (np.flatnonzero(first_op[1:]) + 1 + ops0).tolist() + [ops0 + len(o_pos)] if len(o_pos) else []
    return o_key


def _pair(out: Compiled, keys: np.ndarray) -> None:
    """Each op's peer, the op of the same message at the other end, or -1 (`missing`: the
    first op without one). ``o_batch`` ends with a batch no op is in, which never becomes
    active: the batch of peer -1, for runs of partial programs."""
    code = np.asarray(out.o_code, np.int64)
    sends = np.flatnonzero((code == COMM) | (code == COMM + 2))
    recvs = np.flatnonzero((code == COMM + 1) | (code == COMM + 3))
    peer = np.full(len(code), -1, np.int64)
    if len(sends) and len(recvs):
        order = np.argsort(keys[recvs], kind="stable")
        rk, ro = keys[recvs][order], recvs[order]
        at = np.minimum(np.searchsorted(rk, keys[sends]), len(rk) - 1)
        hit = rk[at] == keys[sends]
        peer[sends[hit]] = ro[at[hit]]
        peer[ro[at[hit]]] = sends[hit]
    out.o_peer = peer.tolist()
    b_ops = np.asarray(out.b_ops, np.int64)
    out.b_size = np.diff(b_ops).tolist()
    out.b_head = np.repeat(out.b_first[:-1], np.diff(out.b_first)).tolist()
    lost = np.flatnonzero(peer < 0)
    out.missing = int(lost[0]) if len(lost) else -1
    out.o_batch.append(len(out.b_ops) - 1)


def missing_peer(prog: Compiled) -> str:
    """The error for ``prog.missing``, an op without a peer."""
    o = prog.missing
    return (
        f"rank {prog.o_rank[o]} step {prog.o_index[o]} ({text(prog.o_stage[o], prog.o_code[o], prog.o_mb[o])}) "
        "has no matching send or receive"
    )


def add_reductions(prog: Compiled) -> None:
    """Insert one ``reduce`` item per stage that has a backward, right after its last backward
    and after the post carrying that stage's last gradient send (`program.with_reductions`)."""
    for r, kinds in enumerate(prog.kinds):
        args, index = prog.args[r], prog.index[r]
        last: dict[int, int] = {}  # stage -> item after which it reduces
        for j, (kind, x) in enumerate(zip(kinds, args)):
            if kind == COMPUTE and IS_BACKWARD[prog.c_code[x]]:
                last[prog.c_stage[x]] = j
            elif kind == POST:
                for o in range(prog.b_ops[x], prog.b_ops[x + 1]):
                    if prog.o_code[o] == SEND_B and prog.o_stage[o] in last:
                        last[prog.o_stage[o]] = j
        after: dict[int, list[int]] = {}
        for stage, j in sorted(last.items()):
            after.setdefault(j, []).append(stage)
        k2, a2, i2 = [], [], []
        for j, (kind, x, i) in enumerate(zip(kinds, args, index)):
            k2.append(kind)
            a2.append(x)
            i2.append(i)
            for stage in after.get(j, ()):
                k2.append(REDUCE)
                a2.append(len(prog.r_stage))
                i2.append(i)
                prog.r_stage.append(stage)
        prog.kinds[r], prog.args[r], prog.index[r] = k2, a2, i2
