"""`Span`: the typed timing span every reader consumes (no action strings parsed back), and
`handoffs` matching a send to the wait that received it across ranks."""

import pickle

import pytest

from ppx.measure.spans import CATEGORY, COMM, COMPUTE, DP_COMM, WAIT, Span, handoffs
from ppx.schedules.ir.action import Action, Op


def span(kind: str, actions: str, start: float, end: float, label: str = "") -> Span:
    acts = tuple(Action.parse(a) for a in actions.split())
    return Span(kind, label or actions, acts, start, end)


def two_rank_step() -> dict:
    """Rank 0 computes 0F0 and posts its send at 1.0; rank 1 posts the receive, waits from 0.2
    to 1.3, then computes 1F0. Rank 1's 1RECV_F1 is waited on, but rank 0 never sends 0F1."""
    return {
        0: [span("compute", "0F0", 0.0, 1.0), span("post", "0SEND_F0", 1.0, 1.1)],
        1: [
            span("post", "1RECV_F0 1RECV_F1", 0.0, 0.2),
            span("wait", "1RECV_F0", 0.2, 1.3, "wait 1RECV_F0"),
            span("compute", "1F0", 1.3, 2.3),
            span("wait", "1RECV_F1", 2.3, 2.4, "wait 1RECV_F1"),
            Span("drain", "wait sends", (), 2.4, 2.5),
        ],
    }


def test_category_follows_the_kind():
    assert [span(k, "0F0", 0, 1).category for k in ("compute", "post", "wait")] == [COMPUTE, COMM, WAIT]
    assert Span("drain", "wait sends", (), 0, 1).category == WAIT
    assert Span("reduce", "0REDUCE_GRAD", (), 0, 1).category == DP_COMM
    assert set(CATEGORY) == {"compute", "post", "reduce", "wait", "drain"}


def test_span_is_typed_frozen_and_shifts_onto_another_clock():
    sp = span("post", "0SEND_F1 0RECV_B0", 1.0, 1.5)
    assert sp.actions == (Action(0, Op.SEND_F, 1), Action(0, Op.RECV_B, 0)) and sp.action.op is Op.SEND_F
    assert sp.duration_s == pytest.approx(0.5)
    moved = sp.shifted(0.25)
    assert (moved.start_s, moved.end_s, moved.actions, moved.label) == (1.25, 1.75, sp.actions, sp.label)
    with pytest.raises(AttributeError):
        sp.start_s = 0.0  # frozen
    assert pickle.loads(pickle.dumps(moved)) == moved  # as dist.gather_object sends it to rank 0


def test_handoffs_pair_each_send_with_the_wait_that_received_it():
    got = list(handoffs(two_rank_step(), (0, 1)))
    assert len(got) == 1  # 1RECV_F1's wait has no send in this step
    h = got[0]
    assert (h.send, h.rank, h.posted_s) == (Action(0, Op.SEND_F, 0), 0, 1.0)
    assert (h.peer, h.wait_start_s, h.wait_end_s) == (1, 0.2, 1.3)
    assert list(handoffs({0: two_rank_step()[0]}, (0, 1))) == []  # no wait to receive it


def test_step_breakdown_splits_a_wait_at_the_send():
    from ppx.measure.metrics import span_totals, step_breakdown

    step = two_rank_step()
    totals = span_totals(step[1])
    assert totals == pytest.approx({COMPUTE: 1.0, COMM: 0.2, DP_COMM: 0.0, WAIT: 1.1 + 0.1 + 0.1})
    records = [
        {
            "rank": r,
            "start": 0.0,
            "end": 2.5,
            "loss": None,
            "spans": sp,
            **{f"{c}_s": v for c, v in span_totals(sp).items()},
        }
        for r, sp in step.items()
    ]
    one = step_breakdown(records, (0, 1))["ranks"][1]
    assert one["transfer_s"] == pytest.approx(0.3)  # the wait after 0SEND_F0 was posted at 1.0


def test_chrome_trace_has_a_slice_per_span_and_a_flow_per_handoff():
    from ppx.report.timeline import chrome_trace

    trace = chrome_trace([{"step": 0, "ranks": two_rank_step()}], (0, 1), "hand")
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["name"], e["cat"]) for e in slices][:3] == [
        (0, "0F0", "compute"),
        (0, "0SEND_F0", "comm"),
        (1, "1RECV_F0 1RECV_F1", "comm"),
    ]
    assert slices[3]["ts"] == 200000.0 and slices[3]["dur"] == pytest.approx(1.1e6)  # microseconds from the first start
    flows = [e for e in trace["traceEvents"] if e["ph"] in "sf"]
    assert [(e["ph"], e["name"], e["pid"]) for e in flows] == [("s", "0SEND_F0", 0), ("f", "0SEND_F0", 1)]
