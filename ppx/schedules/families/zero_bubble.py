"""The zero-bubble handcrafted schedules (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv
2401.10241, section 2): 1F1B-like orders with the backward split into an input-gradient pass
I (on the critical path, sent upstream at once) and a weight-gradient pass W (off it), placed
to fill the bubbles. With t_f = t_b = t_w, ZB-H1 cuts 1F1B's idle time to a third at 1F1B's
memory; ZB-H2 leaves none inside any rank's span, for 2p-1 microbatches in flight."""

from __future__ import annotations

from ppx.schedules.ir.action import F, I, W
from ppx.schedules.ir.schedule import Schedule


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1: rank r runs 1F1B's p-r-1 warmup forwards, then F, I pairs, holding its first r
    weight passes back so they fill the drain bubble; every rank then holds at most p
    microbatches, 1F1B's peak. With t_f = t_b = t_w the bubble drops from 1F1B's 3(p-1)
    units to (p-1): a third."""
    rows = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [F(r, i) for i in range(warmup)]
        deferred = r  # weight passes this rank holds back
        w_next = 0
        for k in range(m):  # the k-th input-gradient pass, after the (warmup+k)-th forward
            if warmup + k < m:
                row.append(F(r, warmup + k))
            row.append(I(r, k))
            if k >= deferred:
                row.append(W(r, w_next))
                w_next += 1
        row += [W(r, i) for i in range(w_next, m)]
        rows.append(row)
    return Schedule("zb_h1", m, tuple(range(p)), tuple(tuple(x) for x in rows))


def zb_h2(p: int, m: int) -> Schedule:
    """ZB-H2: rank r runs 2(p-r-1)+1 warmup forwards, as many as fit before its first I comes
    back (2p-1 on rank 0), then one I, one W and one F per microbatch, except that it holds
    its first 2r weight passes back: rank r's I's run two slots apart until then, so the
    input gradients reach rank 0 as fast as it can take them, and the held-back W's fill the
    drain. With t_f = t_b = t_w every rank is busy from its first forward to its last W
    (the paper's parallelogram) once m >= 2p-1, holding at most 2p-1 microbatches: 2p-1-2r
    waiting for I and 2r for W, the paper's (2p-2i+1) M_B + (2i-2) M_W for worker i = r+1.

    On NCCL, Megatron's placement of its sends and receives (`lowering.add_comms`) deadlocks
    for m >= 2p, where `placement.place_comms` takes the lockstep one."""
    rows = []
    for r in range(p):
        warmup = min(2 * (p - r - 1) + 1, m)
        row = [F(r, i) for i in range(warmup)]
        deferred = 2 * r  # weight passes this rank holds back
        w_next = 0
        for k in range(m):  # the k-th input-gradient pass, then a W and the next forward
            row.append(I(r, k))
            if k >= deferred:
                row.append(W(r, w_next))
                w_next += 1
            if warmup + k < m:
                row.append(F(r, warmup + k))
        row += [W(r, i) for i in range(w_next, m)]
        rows.append(row)
    return Schedule("zb_h2", m, tuple(range(p)), tuple(tuple(x) for x in rows))
