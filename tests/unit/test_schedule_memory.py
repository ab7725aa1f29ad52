"""The predicted activation memory of a schedule (`ppx.schedules.sim.memory.peak_held`) against
counts made by hand and the authors' figures."""

from __future__ import annotations

import pytest

from helpers.schedule_checks import peak_in_flight
from ppx.schedules import registry
from ppx.schedules.ir.action import Op
from ppx.schedules.sim.memory import peak_held


@pytest.mark.parametrize("name", [n for n in registry.FAMILIES if n != "forward_only"])
def test_one_byte_per_microbatch_peaks_at_the_microbatches_in_flight(name):
    sched = registry.build(name, 4, 8)
    assert peak_held(sched, [1] * sched.num_stages) == [peak_in_flight(row) for row in sched.actions]


def test_bytes_per_stage_weigh_each_stage():
    gpipe = registry.build("gpipe", 2, 4)
    assert peak_held(gpipe, [3, 5]) == [12, 20]  # all four microbatches held on each rank
    one_f_one_b = registry.build("1f1b", 2, 4)
    assert peak_held(one_f_one_b, [3, 5]) == [6, 5]  # p - r microbatches in flight


def test_input_share_is_freed_by_i_and_the_rest_by_w():
    """ZB-H2 with I freeing M_B - M_W: the paper's (2p-2i+1) M_B + (2i-2) M_W on worker i."""
    p, m = 4, 16
    sched = registry.build("zb_h2", p, m)
    m_b, m_w = 1.0, 0.25
    got = peak_held(sched, [m_b] * p, input_share=1 - m_w / m_b)
    want = [(2 * p - 2 * i + 1) * m_b + (2 * i - 2) * m_w for i in range(1, p + 1)]
    assert got == pytest.approx(want)


def test_forward_only_holds_what_no_backward_frees():
    sched = registry.build("forward_only", 2, 4)
    assert not any(a.op.is_backward for row in sched.actions for a in row)
    assert peak_held(sched, [1, 1]) == [4, 4]  # a run keeps nothing then: no saved bytes are measured
    assert all(a.op is Op.F or a.op.is_comm for row in sched.actions for a in row)


# ZB-V at p=2, m=2: rank 1 holds stages 1 and 2, and runs 1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1
@pytest.mark.parametrize(
    ("shared", "peak"),
    [
        (None, 28),  # 10 + 4 a microbatch, two in flight
        ((3, "a W"), 22),  # 3 of stage 2's 4 counted once, until 2W0 (before 1W0)
        ((3, "the I before"), 22),  # until 2W0 too: it comes before 1I0
        ((3, "its I"), 25),  # until 2I0, which frees nothing of its own here: 3 back on the 22
    ],
)
def test_bytes_two_stages_of_a_rank_save_between_them_are_counted_once(shared, peak):
    zbv = registry.build("zbv", 2, 2)
    assert [str(a) for a in zbv.actions[1] if a.op.is_compute][:8] == "1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0".split()
    per = [0, 10, 4, 0]
    got = peak_held(zbv, per, shared=[None, None, shared, None])
    assert got == [0, peak]
    # stages handed on between ranks share nothing: the same figures change no other schedule
    one_f_one_b = registry.build("1f1b", 2, 2)
    assert peak_held(one_f_one_b, [10, 4], shared=[None, shared]) == peak_held(one_f_one_b, [10, 4])
