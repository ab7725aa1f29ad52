"""ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, section 2.2): the
order, its memory against the paper's (2p-1) M_B, and its bubble against the paper's closed
form (p-1)(T_F+T_B-2T_W), measured as the paper measures it, and against ppx's idle share of a
synchronous step. Timings are the order's own, at zero communication: the simulator on gloo
with every receive posted up front, so that no placement of the sends and receives adds
waits of its own."""

from __future__ import annotations

import pytest

from helpers.schedule_checks import UNIT
from helpers.schedule_checks import own_timeline as timeline
from ppx.schedules import Costs, Op, registry, simulate
from ppx.schedules.families.zero_bubble import zb_h1, zb_h2
from ppx.schedules.grid import render_grid

SHAPES = [(p, m) for p in range(1, 9) for m in sorted({1, 2, p, 2 * p - 1, 2 * p, 3 * p + 1, 4 * p})]


def test_order_follows_the_paper():
    rows = [" ".join(f"{a.op.value}{a.mb}" for a in row) for row in zb_h2(4, 8).actions]
    assert rows == [
        "F0 F1 F2 F3 F4 F5 F6 I0 W0 F7 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 I7 W7",
        "F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 W0 F7 I3 W1 I4 W2 I5 W3 I6 W4 I7 W5 W6 W7",
        "F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 W0 F7 I5 W1 I6 W2 I7 W3 W4 W5 W6 W7",
        "F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 F7 I7 W1 W2 W3 W4 W5 W6 W7",
    ]


@pytest.mark.parametrize("p,m", SHAPES)
def test_every_microbatch_runs_f_i_w_once_in_order_and_the_order_runs(p, m):
    sched = zb_h2(p, m)
    assert sched.stage_to_rank == tuple(range(p)) and sched.num_microbatches == m
    for r, row in enumerate(sched.actions):
        assert all(a.stage == r for a in row)
        for op in (Op.F, Op.I, Op.W):
            assert sorted(a.mb for a in row if a.op is op) == list(range(m)), (r, op)
        at = {(a.op, a.mb): k for k, a in enumerate(row)}
        assert all(at[(Op.F, i)] < at[(Op.I, i)] < at[(Op.W, i)] for i in range(m))
    timeline(sched)  # the dry run completes: no rank waits for what never comes


def _peak(row, w_share: float = 1.0) -> float:
    """Peak activation memory of one rank's list, in units of one microbatch's activations
    for I (M_B); one waiting only for its W holds ``w_share`` of that (M_W / M_B)."""
    for_i = for_w = peak = 0
    for a in row:
        for_i += (a.op is Op.F) - (a.op is Op.I)
        for_w += (a.op is Op.I) - (a.op is Op.W)
        peak = max(peak, for_i + w_share * for_w)
    return peak


@pytest.mark.parametrize("p,m", SHAPES)
def test_peak_in_flight_is_the_papers_2p_minus_1(p, m):
    """Every rank holds at most 2p-1 microbatches (all m when fewer); once m >= 2p-1, rank r's
    peak is the paper's (2p-2i+1) M_B + (2i-2) M_W for worker i = r+1: 2p-2r-1 microbatches
    waiting for I and 2r only for W."""
    rows = zb_h2(p, m).actions
    assert [_peak(row) for row in rows] == [min(2 * p - 1, m)] * p
    if m >= 2 * p - 1:
        assert [_peak(row, 0.5) for row in rows] == [2 * p - 2 * r - 1 + 0.5 * 2 * r for r in range(p)]


@pytest.mark.parametrize("p", range(1, 9))
def test_bubble_with_equal_costs_is_the_closed_form(p):
    """t_f = t_b = t_w, m >= 2p-1: no rank idles between its first forward and its last W
    (the paper's bubble (p-1)(T_F+T_B-2T_W) = 0); a synchronous step still counts the
    parallelogram's corners, rank r starting r slots late and ending p-1-r slots early: p-1
    idle slots per rank, (p-1)/(3m+p-1) of the step."""
    for m in (2 * p - 1, 2 * p, 3 * p + 1, 4 * p):
        t = timeline(zb_h2(p, m))
        assert [ev[-1].end - ev[0].start for ev in t.events] == [3 * m] * p
        assert t.bubble_fraction() == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)


def _papers_bubble(sched, costs) -> float:
    """The paper's bubble size: the longest rank's time from its first action to its last,
    less m (T_F + T_B + T_W) (its section 5.3: cost is the largest execution time of all
    stages; optimizer steps are not synchronised, so the ranks' start offsets do not count)."""
    t = timeline(sched, costs)
    longest = max(ev[-1].end - ev[0].start for ev in t.events)
    return longest - sched.num_microbatches * (costs.fwd + costs.bwd + costs.wgrad)


# T_W <= T_F <= T_B, as in the paper's transformer layers (its Table 1)
TIMES = [(1, 1, 1), (2, 2, 1), (1, 2, 1), (2, 3, 1), (3, 3, 2), (3, 4, 2), (1, 1.5, 0.5)]


@pytest.mark.parametrize("tf,tb,tw", TIMES)
@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_bubble_is_the_papers_table_2(tf, tb, tw, p):
    """The paper's Table 2: ZB-H2 (p-1)(T_F+T_B-2T_W), ZB-H1 (p-1)(T_F+T_B-T_W), with the
    order fixed as drawn for T_F = T_B = T_W."""
    costs = Costs(fwd=tf, bwd=tb, wgrad=tw)
    for m in (2 * p - 1, 2 * p, 4 * p):
        assert _papers_bubble(zb_h2(p, m), costs) == pytest.approx((p - 1) * (tf + tb - 2 * tw))
        assert _papers_bubble(zb_h1(p, m), costs) == pytest.approx((p - 1) * (tf + tb - tw))


# p = 1..8 placed for NCCL; for gloo to p = 4, as in test_looped_bfs and test_interleaved_zb
@pytest.mark.parametrize("transport,ps", [("nccl", range(1, 9)), ("gloo", range(1, 5))])
def test_the_validator_passes_for_every_shape(transport, ps):
    for p in ps:
        for m in range(1, 4 * p + 2):
            built = registry.build("zb_h2", p, m, None, transport)  # placed, validated
            assert built.compute_only().actions == zb_h2(p, m).actions


def test_theory_is_the_closed_form_or_the_simulator():
    fam = registry.family("zb_h2")
    assert fam.bubble(4, 8, 1) == (4 - 1) / (3 * 8 + 4 - 1)
    for p, m in [(2, 2), (4, 1), (4, 6)]:  # m < 2p-1: simulated
        assert fam.bubble(p, m, 1) == pytest.approx(timeline(zb_h2(p, m)).bubble_fraction())


def test_the_grid_prints_the_parallelogram():
    """Rank r starts r slots late and ends 3-r early, busy in between."""
    grid = render_grid(registry.build("zb_h2", 4, 8), UNIT).splitlines()
    for r, (line, row) in enumerate(zip(grid[1:], zb_h2(4, 8).actions)):
        assert line.split()[2:] == ["."] * r + [f"{a.op.value}{a.mb}" for a in row] + ["."] * (3 - r)


@pytest.mark.parametrize(
    "p,m",
    [(2, 4), (3, 6), (4, 8), (4, 16), (8, 16)] + [(2, 3), (4, 7)],
)
def test_built_schedule_runs_at_its_own_bubble_on_nccl(p, m):
    """Placed for NCCL (each rank's batches complete in order), the built list keeps the
    order's own timing. Where Megatron's placement runs but is slower (3 <= m < 2p: rank r
    posts its warmup sends and the receive of its first I in one stream, and rank r+1 takes
    the last two of those forwards only after its own first I's; p=4, m=7: 52% idle against
    12.5%), the lockstep placement is taken."""
    t = simulate(registry.build("zb_h2", p, m), UNIT)
    assert t.bubble_fraction() == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
