"""Lowering (ppx.schedules.comms.lowering) and the compiled program: where SEND/RECV actions go, and
receives posted early without moving the blocking points."""

from __future__ import annotations

import pytest

from ppx import schedules
from ppx.schedules.comms.lowering import comm_batches, receive_early
from ppx.schedules.comms.program import compile_program


def test_comms_pair_1f1b_send_forward_with_receive_backward():
    row = [str(a) for a in schedules.build("1f1b", 4, 8).actions[1]]
    k = row.index("1SEND_F2")
    assert row[k + 1] == "1RECV_B0"  # posted together in one batch


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)])
@pytest.mark.parametrize("lookahead", [-1, 0, 1, 3])
def test_receives_move_earlier_and_waits_stay_put(name, v, lookahead):

    sched = schedules.build(name, 4, 8, virtual_stages=v)
    for row in sched.actions:
        early = receive_early(row, lookahead)
        assert sorted(map(str, early)) == sorted(map(str, row))  # nothing lost or added
        others = lambda r: [a for a in r if a.op.is_compute or a.op.is_send]  # noqa: E731
        assert others(early) == others(row)  # computes and sends keep their order
        recvs = lambda r: [a for a in r if a.op.is_comm and not a.op.is_send]  # noqa: E731
        assert recvs(early) == recvs(row)  # receives keep their order (gloo matches them in order)
        computes_before = lambda r, a: sum(1 for b in r[: r.index(a)] if b.op.is_compute)  # noqa: E731
        for k, a in enumerate(row):
            if a.op.is_comm and not a.op.is_send:
                if lookahead >= 0:
                    assert computes_before(early, a) == max(computes_before(row, a) - lookahead, 0)
                else:  # all at the first wait: after the computes that need no receive
                    first = next(k for k, b in enumerate(row) if b.op.is_comm and not b.op.is_send)
                    assert computes_before(early, a) == computes_before(row, row[first])
        if lookahead != 0:  # moved receives are posted ahead of the sends they land next to, except upfront
            for start, end in comm_batches(early):
                kinds = [b.op.is_send for b in early[start:end]]
                assert kinds == sorted(kinds, reverse=lookahead < 0)
        program = compile_program(row, sched.stage_to_rank, lookahead)
        waits = [it.label.split()[1] for it in program if it.kind == "wait"]
        plain = [it.label.split()[1] for it in compile_program(row, sched.stage_to_rank) if it.kind == "wait"]
        assert waits == plain  # the same blocking points, right before the same computes
        computes = [it for it in program if it.kind == "compute"]
        assert [it.actions[0] for it in computes] == [a for a in row if a.op.is_compute]
