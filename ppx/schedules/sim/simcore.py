"""The simulator's event-driven core: a `Compiled` program run on a unit-free clock.

A rank runs item after item until a wait finds its tensor not there yet (or, at its drain,
a send not done); it then parks on the batch (nccl) or op (gloo) it needs, and the event
that completes that batch or op puts it back on the stack of ranks to run. The run ends
when no rank can move: every program finished, or a deadlock. With fixed costs the times
are the least fixed point of the transport's rules, whatever order the ranks run in, so
they equal the old round-by-round simulator's (tests/unit/test_simulate_speedup.py).

Transport rules (`ppx.schedules.sim.transports`):
``nccl``: a batch becomes active once posted and its rank's previous batch is complete
(one stream per rank); an op completes ``p2p`` after both ends' batches are active; a
received tensor is ready when its whole batch is complete.
``gloo``: each op completes ``p2p`` after both ends are posted; a received tensor is ready
when its own receive is done, having moved since its sender began posting its batch.

Costs come as flat lists (`ppx.schedules.sim.simulate`): per compute its work and the
overhead after it, per op its posting time and its latency, per reduce its time.
"""

from __future__ import annotations

from ppx.schedules.sim.compiled import COMPUTE, POST, REDUCE, WAIT, Compiled


class State:
    """Where a run stopped: each rank's program counter, clock and seconds by category, each
    compute's span, and the transport's view of every op and batch."""

    def __init__(self, prog: Compiled):
        n, ops, batches = len(prog.kinds), len(prog.o_rank), len(prog.b_ops) - 1
        self.n = n
        self.pc, self.clock, self.end = [0] * n, [0.0] * n, [0.0] * n
        self.ce: list = [None] * n  # end of the last compute, before its overhead: when its sends leave
        self.work, self.comm, self.dp = [0.0] * n, [0.0] * n, [0.0] * n
        self.start = [0.0] * len(prog.c_stage)
        self.stop = [0.0] * len(prog.c_stage)
        # one slot more than ops and batches: peer -1's, never posted, never active
        self.o_done: list = [None] * (ops + 1)
        self.o_went: list = [None] * (ops + 1)  # nccl: when both ends' batches were active
        self.o_posted: list = [None] * (ops + 1)  # gloo: when each op is out (nccl: its batch's posting)
        self.b_start: list = [None] * (batches + 1)  # when its posting began
        self.b_posted: list = [None] * (batches + 1)
        self.b_active: list = [None] * (batches + 1)
        self.b_complete: list = [None] * (batches + 1)
        self.head = prog.b_first[:n]  # nccl: each rank's first incomplete batch

    def finished(self, prog: Compiled) -> bool:
        return all(pc == len(k) for pc, k in zip(self.pc, prog.kinds))


def run_nccl(prog: Compiled, dur, aft, post, lat, red) -> State:
    """Run ``prog`` under nccl's rules; the state is finished unless the programs deadlock."""
    s = State(prog)
    kinds_of, args_of, b_ops, b_first = prog.kinds, prog.args, prog.b_ops, prog.b_first
    o_peer, o_batch, o_rank = prog.o_peer, prog.o_batch, prog.o_rank
    o_done, o_went = s.o_done, s.o_went
    b_start, b_posted, b_active, b_complete, head = s.b_start, s.b_posted, s.b_active, s.b_complete, s.head
    start, stop = s.start, s.stop
    costly = any(post)
    left = prog.b_size[:]  # ops of each batch not done
    first_of = prog.b_head  # the first batch of each batch's rank
    waiter = [-1] * len(left)  # the rank parked on each batch
    stack = list(range(s.n - 1, -1, -1))
    while stack:
        r = stack.pop()
        kinds, args = kinds_of[r], args_of[r]
        pc, clock, ce, work, comm = s.pc[r], s.clock[r], s.ce[r], s.work[r], s.comm[r]
        while True:
            kind = kinds[pc]
            if kind == COMPUTE:
                c = args[pc]
                d = dur[c]
                start[c] = clock
                work += d
                ce = clock + d
                clock = ce + aft[c]
                stop[c] = clock
            elif kind == WAIT:
                o = args[pc]
                ready = b_complete[o_batch[o]]
                if ready is None:
                    waiter[o_batch[o]] = r
                    break
                if ready > clock:  # transfer: the wait after the message could move
                    done = o_done[o]
                    went = o_went[o]
                    moved = (done if done < ready else ready) - (went if went > clock else clock)
                    if moved > 0.0:
                        comm += moved
                    clock = ready
            elif kind == POST:
                b = args[pc]
                t = clock if ce is None else ce
                b_start[b] = t
                if costly:  # else every op is out at t, and nothing adds to the clock
                    for o in range(b_ops[b], b_ops[b + 1]):
                        cost = post[o]
                        t += cost
                        clock += cost
                        comm += cost
                b_posted[b] = t
                ce = None
                todo = [b] if head[r] == b else None
                while todo:  # activate head batches, complete matched ops, retire complete batches
                    b = todo.pop()
                    prev = b_complete[b - 1] if b > first_of[b] else 0.0
                    act = b_posted[b]
                    if prev > act:
                        act = prev
                    b_active[b] = act
                    done = []
                    for o in range(b_ops[b], b_ops[b + 1]):
                        if o_done[o] is None:
                            q = o_peer[o]
                            qb = o_batch[q]
                            qa = b_active[qb]
                            if qa is not None:
                                went = qa if qa > act else act
                                o_went[o] = o_went[q] = went
                                o_done[o] = o_done[q] = went + lat[o]
                                left[b] -= 1
                                left[qb] -= 1
                                if left[qb] == 0:
                                    done.append(qb)
                    if left[b] == 0:
                        done.append(b)
                    for x in done:
                        o = b_ops[x]
                        b_complete[x] = o_done[o] if b_ops[x + 1] == o + 1 else max(o_done[o : b_ops[x + 1]])
                        rx = o_rank[b_ops[x]]
                        head[rx] = x + 1
                        if waiter[x] >= 0:
                            stack.append(waiter[x])
                            waiter[x] = -1
                        if x + 1 < b_first[rx + 1] and b_posted[x + 1] is not None:
                            todo.append(x + 1)
            elif kind == REDUCE:  # blocks the rank, after its last compute's overhead
                d = red[args[pc]]
                s.dp[r] += d
                clock += d
            else:  # drain: a rank ends when its last batch completes
                last = b_first[r + 1] - 1
                if head[r] <= last:
                    waiter[last] = r
                    break
                s.end[r] = max([clock] + b_complete[b_first[r] : last + 1])
                pc += 1
                break
            pc += 1
        s.pc[r], s.clock[r], s.ce[r], s.work[r], s.comm[r] = pc, clock, ce, work, comm
    return s


def run_gloo(prog: Compiled, dur, aft, post, lat, red) -> State:
    """Run ``prog`` under gloo's rules; the state is finished unless the programs deadlock."""
    s = State(prog)
    kinds_of, args_of, b_ops, b_first = prog.kinds, prog.args, prog.b_ops, prog.b_first
    o_peer, o_batch, o_rank = prog.o_peer, prog.o_batch, prog.o_rank
    o_done, o_posted, b_start, b_posted = s.o_done, s.o_posted, s.b_start, s.b_posted
    start, stop = s.start, s.stop
    left = [b_ops[b_first[r + 1]] - b_ops[b_first[r]] for r in range(s.n)]  # each rank's ops not done
    waiter = [-1] * len(o_rank)  # the rank parked on each receive
    draining = [False] * s.n
    stack = list(range(s.n - 1, -1, -1))
    while stack:
        r = stack.pop()
        kinds, args = kinds_of[r], args_of[r]
        pc, clock, ce, work, comm = s.pc[r], s.clock[r], s.ce[r], s.work[r], s.comm[r]
        while True:
            kind = kinds[pc]
            if kind == COMPUTE:
                c = args[pc]
                d = dur[c]
                start[c] = clock
                work += d
                ce = clock + d
                clock = ce + aft[c]
                stop[c] = clock
            elif kind == WAIT:
                o = args[pc]
                ready = o_done[o]
                if ready is None:
                    waiter[o] = r
                    break
                if ready > clock:  # transfer: the wait after the sender began posting
                    moving = b_start[o_batch[o_peer[o]]]
                    comm += max(ready - max(clock, moving), 0.0)
                    clock = ready
            elif kind == POST:
                b = args[pc]
                t = clock if ce is None else ce
                b_start[b] = t
                ops = range(b_ops[b], b_ops[b + 1])
                for o in ops:
                    cost = post[o]
                    t += cost
                    clock += cost
                    o_posted[o] = t
                    comm += cost
                b_posted[b] = t
                ce = None
                for o in ops:
                    q = o_peer[o]
                    qt = o_posted[q]
                    if qt is not None:
                        mine = o_posted[o]
                        o_done[o] = o_done[q] = (qt if qt > mine else mine) + lat[o]
                        rq = o_rank[q]
                        left[r] -= 1
                        left[rq] -= 1
                        if waiter[q] >= 0:
                            stack.append(waiter[q])
                            waiter[q] = -1
                        if draining[rq] and left[rq] == 0:
                            stack.append(rq)
                            draining[rq] = False
            elif kind == REDUCE:
                d = red[args[pc]]
                s.dp[r] += d
                clock += d
            else:  # drain: a rank ends when its last op completes
                if left[r]:
                    draining[r] = True
                    break
                s.end[r] = max([clock] + o_done[b_ops[b_first[r]] : b_ops[b_first[r + 1]]])
                pc += 1
                break
            pc += 1
        s.pc[r], s.clock[r], s.ce[r], s.work[r], s.comm[r] = pc, clock, ce, work, comm
    return s
