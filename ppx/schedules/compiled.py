"""Every rank's row compiled at once into the integer program the simulator runs.

The items are `ppx.schedules.program`'s (a ``post`` of one batch of consecutive sends and
receives, a ``wait`` before each consumer of a received tensor, ``compute``, ``reduce``,
``drain``), here as two parallel integer lists per rank: the kind and its argument (a batch,
an op, a compute, a stage). Sends and receives are numbered once, rank by rank (ops), each
paired with its peer through its message key; computes and batches likewise, so the
simulator keeps its state in flat lists indexed by those numbers instead of objects.
"""

from __future__ import annotations

from ppx.schedules.codes import COMM, IS_BACKWARD, IS_SEND, SEND_B, Rows, input_key, message_key, text

POST, WAIT, COMPUTE, REDUCE, DRAIN = range(5)


class Compiled:
    """The programs of every rank and the numbered computes, ops and batches they use."""

    def __init__(self, n: int):
        self.kinds: list[list[int]] = [[] for _ in range(n)]
        self.args: list[list[int]] = [[] for _ in range(n)]
        self.index: list[list[int]] = [[] for _ in range(n)]  # each item's position in the row
        self.c_first = [0] * (n + 1)  # rank r's computes are c_first[r]..c_first[r+1]-1
        self.c_stage, self.c_code, self.c_mb, self.c_pos = [], [], [], []
        self.b_first = [0] * (n + 1)  # rank r's batches are b_first[r]..b_first[r+1]-1
        self.b_ops: list[int] = [0]  # batch b's ops are b_ops[b]..b_ops[b+1]-1
        self.o_rank, self.o_index, self.o_stage, self.o_code, self.o_mb = [], [], [], [], []
        self.o_batch: list[int] = []
        self.o_peer: list[int] = []
        self.r_stage: list[int] = []  # each reduce's stage (`add_reductions`)
        self.missing = -1  # the first op without a peer, or -1


def compile_rows(rows: Rows, cells=()) -> Compiled:
    """``rows`` (per rank, encoded, receives already where they are posted) compiled and
    paired. ``cells[r]``: rank r's overlapped cells (compute indices), as `Schedule.cells`."""
    out = Compiled(len(rows))
    for r, (st, oc, mb) in enumerate(rows):
        _compile_rank(out, r, st, oc, mb, cells[r] if cells else ())
        out.c_first[r + 1], out.b_first[r + 1] = len(out.c_stage), len(out.b_ops) - 1
    _pair(out)
    return out


def _compile_rank(out: Compiled, r: int, st, oc, mb, cells) -> None:
    kinds, args, index = out.kinds[r], out.args[r], out.index[r]
    c_stage, c_code, c_mb, c_pos = out.c_stage, out.c_code, out.c_mb, out.c_pos
    o_rank, o_index, o_stage, o_code, o_mb, o_batch = (
        out.o_rank,
        out.o_index,
        out.o_stage,
        out.o_code,
        out.o_mb,
        out.o_batch,
    )
    received: dict[int, int] = {}  # message key of a receive posted earlier -> its op
    length, k, n = len(oc), 0, 0  # position in the row, computes so far
    while k < length:
        if oc[k] >= COMM:
            b = len(out.b_ops) - 1
            kinds.append(POST)
            args.append(b)
            index.append(k)
            while k < length and oc[k] >= COMM:
                c = oc[k]
                if not IS_SEND[c]:
                    received[message_key(st[k], c, mb[k])] = len(o_rank)
                o_rank.append(r)
                o_index.append(k)
                o_stage.append(st[k])
                o_code.append(c)
                o_mb.append(mb[k])
                o_batch.append(b)
                k += 1
            out.b_ops.append(len(o_rank))
            continue
        width = 2 if n in cells else 1
        unit = range(k, min(k + width, length))
        for j in unit:
            key = input_key(st[j], oc[j], mb[j])
            if key is not None and key in received:
                kinds.append(WAIT)
                args.append(received[key])
                index.append(k)
        for j in unit:
            kinds.append(COMPUTE)
            args.append(len(c_stage))
            index.append(j)
            c_stage.append(st[j])
            c_code.append(oc[j])
            c_mb.append(mb[j])
            c_pos.append(j)
        k, n = k + len(unit), n + len(unit)
    kinds.append(DRAIN)
    args.append(0)
    index.append(length)


def _pair(out: Compiled) -> None:
    """Each op's peer, the op of the same message at the other end, or -1 (`missing`: the
    first op without one). ``o_batch`` ends with a batch no op is in, which never becomes
    active: the batch of peer -1, for runs of partial programs."""
    sends: dict[int, int] = {}
    recvs: dict[int, int] = {}
    keys = list(map(message_key, out.o_stage, out.o_code, out.o_mb))
    for o, (key, c) in enumerate(zip(keys, out.o_code)):
        (sends if IS_SEND[c] else recvs)[key] = o
    peer = out.o_peer = [recvs.get(key, -1) if IS_SEND[c] else sends.get(key, -1) for key, c in zip(keys, out.o_code)]
    out.missing = peer.index(-1) if -1 in peer else -1
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
