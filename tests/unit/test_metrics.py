"""A step's time split from its spans (ppx.measure.metrics)."""

from __future__ import annotations

import pytest

from helpers.spans import span
from ppx.measure.metrics import over_ideal, run_summary, step_breakdown


def test_waits_split_into_idle_before_the_send_and_transfer_after_it():
    # rank 0 computes 0F0 over [0, 1] and posts its send at 1.0; rank 1 waits from 0.2 to 1.3:
    # 0.8 s of that is the schedule's idle (nothing sent yet), 0.3 s is transfer
    r0 = {
        "rank": 0,
        "start": 0.0,
        "end": 1.1,
        "loss": None,
        "compute_s": 1.0,
        "comm_s": 0.1,
        "wait_s": 0.0,
        "spans": [span("compute", "0F0", ["0F0"], 0.0, 1.0), span("post", "0SEND_F0", ["0SEND_F0"], 1.0, 1.1)],
    }
    r1 = {
        "rank": 1,
        "start": 0.0,
        "end": 2.3,
        "loss": 1.0,
        "compute_s": 1.0,
        "comm_s": 0.2,
        "wait_s": 1.1,
        "spans": [
            span("post", "1RECV_F0", ["1RECV_F0"], 0.0, 0.2),
            span("wait", "wait 1RECV_F0", ["1RECV_F0"], 0.2, 1.3),
            span("compute", "1F0", ["1F0"], 1.3, 2.3),
        ],
    }
    m = step_breakdown([r0, r1], [0, 1])
    one = m["ranks"][1]
    assert one["transfer_s"] == pytest.approx(0.3) and one["post_s"] == pytest.approx(0.2)
    assert one["comm_s"] == pytest.approx(0.5)
    assert one["idle_s"] == pytest.approx(2.3 - 1.0 - 0.5)  # the 0.8 s before the send, plus nothing else
    assert m["ranks"][0]["transfer_s"] == 0.0
    assert step_breakdown([r0, r1])["ranks"][1]["idle_s"] == pytest.approx(2.3 - 1.0 - 0.2)  # no spans: all idle


def test_a_runs_bubble_over_ideal_is_the_median_of_its_steps_even_of_an_even_count():
    """Each normalisation is its own median: idle / busy of the median idle / step would, of an
    even count of steps, be no step's figure (the middle two's mean does not convert)."""
    steps = [
        {"step_time_s": 1.0, "bubble_fraction": b, "bubble_over_ideal": over_ideal(b), "ranks": []}
        for b in (0.1, 0.2, 0.5, 0.6)
    ]
    out = run_summary(steps)
    assert out["bubble_fraction"] == pytest.approx(0.35)
    assert out["bubble_over_ideal"] == pytest.approx((0.25 + 1.0) / 2)  # not 0.35 / 0.65
    steps[0]["bubble_over_ideal"] = None  # (a step all idle has none: the largest, not the run's figure gone)
    assert run_summary(steps)["bubble_over_ideal"] == pytest.approx((1.0 + 1.5) / 2)
    for s in steps[1:3]:
        s["bubble_over_ideal"] = None
    assert run_summary(steps)["bubble_over_ideal"] is None
