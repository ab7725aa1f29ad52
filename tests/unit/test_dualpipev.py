"""DualPipeV (DeepSeek's DualPipe cut in half, github.com/deepseek-ai/DualPipe): ppx's list is
torch's ScheduleDualPipeV order, overlapped cells included, with torch's shape rule m >= 2p;
it validates for every shape; its bubble is DualPipe's closed form (PP/2-1)(F&B+B-3W) with
PP = 2p stages, which the simulator reproduces at zero communication wherever that form applies
(t_f = t_b, t_w <= t_f; a cell costing F + B, as on CPU); its peak memory is DualPipe's PP+1."""

from __future__ import annotations

import pytest

from helpers.schedule_checks import UNIT, peak_in_flight
from helpers.schedule_checks import own_timeline as timeline
from helpers.torch_orders import torch_order
from ppx.errors import ScheduleError
from ppx.schedules import Costs, Op, registry, simulate
from ppx.schedules.families.dualpipev import dualpipev
from ppx.schedules.families.zbv import v_stage_to_rank
from ppx.schedules.grid import render_grid
from ppx.schedules.registry import dualpipe_bubble

CLASS = "ScheduleDualPipeV"


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_order_is_torchs_cells_included(p):
    for m in (2 * p, 2 * p + 1, 4 * p):
        mine, theirs = dualpipev(p, m), torch_order(CLASS, p, m, 2)
        assert mine.stage_to_rank == theirs.stage_to_rank == v_stage_to_rank(p)
        assert mine.actions == theirs.actions, (p, m)
        assert mine.overlaps == theirs.overlaps, (p, m)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 7), (3, 2)])
def test_shape_rule_is_torchs(p, m):
    """torch refuses fewer microbatches than stages (2p); so does ppx, in one line."""
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        torch_order(CLASS, p, m, 2)
    with pytest.raises(
        ScheduleError, match=rf"^dualpipev needs pipeline.microbatches >= 2 x pipeline.stages = {2 * p} "
    ):
        registry.build("dualpipev", p, m)
    assert registry.theory_bubble("dualpipev", p, m, 2) is None


def test_order_on_the_ranks():
    sched = dualpipev(2, 4)
    assert [" ".join(sched.strings(r)) for r in range(2)] == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 (3F3;0B1)OVERLAP_F_B 3B3 "
        "0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B 2B2 1B2 "
        "2I3 1I3 2W3 1W3",
    ]


# p = 1..8 placed for NCCL; for gloo to p = 4, as in test_looped_bfs and test_interleaved_zb
@pytest.mark.parametrize("transport,ps", [("nccl", range(1, 9)), ("gloo", range(1, 5))])
def test_the_validator_passes_for_every_shape(transport, ps):
    for p in ps:
        for m in range(2 * p, 4 * p + 2):
            built = registry.build("dualpipev", p, m, None, transport)  # placed, validated (cells too)
            want = dualpipev(p, m)
            assert built.compute_only().actions == want.actions and built.overlaps == want.overlaps


def longest_span_idle(sched, costs) -> float:
    """DualPipe's bubble: the longest rank's time from its first action to its last, less its
    work (every rank runs 2m forwards and 2m backwards, B = I + W)."""
    t = timeline(sched, costs)
    longest = max(ev[-1].end - ev[0].start for ev in t.events)
    return longest - 2 * sched.num_microbatches * (costs.fwd + costs.bwd + costs.wgrad)


# (t_f, t_b, t_w): the forward and the input-gradient half of the backward equal, the weight
# pass no longer than either, as DualPipe's closed form assumes
APPLIES = [(1, 1, 1), (1, 1, 0), (1, 1, 0.5), (2, 2, 1), (3, 3, 2), (2, 2, 0.5)]


@pytest.mark.parametrize("tf,tb,tw", APPLIES)
def test_simulator_reproduces_the_closed_form(tf, tb, tw):
    """With F = t_f, a full B = t_b + t_w, W = t_w and a cell F&B = F + B (ppx's clock on CPU,
    a cell's parts one after the other), the simulator's idle on the longest rank (rank 0,
    which starts first and ends last) is (p-1)(F&B+B-3W) for every m >= 2p, and the idle share
    of ppx's synchronous step is that over the step, that plus a rank's 2m (F + B)."""
    costs = Costs(fwd=tf, bwd=tb, wgrad=tw)
    f, b, w = tf, tb + tw, tw
    for p in range(1, 9):
        for m in (2 * p, 2 * p + 1, 3 * p, 4 * p):
            closed = dualpipe_bubble(p, f + b, b, w)
            t = timeline(dualpipev(p, m), costs)
            assert longest_span_idle(dualpipev(p, m), costs) == pytest.approx(closed, abs=1e-9)
            assert t.makespan == pytest.approx(2 * m * (f + b) + closed, abs=1e-9)
            assert t.bubble_fraction() == pytest.approx(closed / (2 * m * (f + b) + closed), abs=1e-12)


def test_the_closed_form_needs_its_assumptions():
    """Off them the fixed order idles otherwise: less with t_b > t_f, more with t_f > t_b or
    t_w > t_f (p = 4, m = 8)."""
    got = {c: longest_span_idle(dualpipev(4, 8), Costs(*c)) for c in [(1, 2, 1), (2, 1, 1), (1, 1, 2)]}
    closed = {c: dualpipe_bubble(4, c[0] + c[1] + c[2], c[1] + c[2], c[2]) for c in got}
    assert got[(1, 2, 1)] < closed[(1, 2, 1)]
    assert got[(2, 1, 1)] > closed[(2, 1, 1)] and got[(1, 1, 2)] > closed[(1, 1, 2)]


def test_registry_theory_is_the_closed_form_at_equal_costs():
    """t_f = t_b = t_w: F = W = 1, B = 2, F&B = 3: 2(p-1) idle slots of 6m + 2(p-1), which is
    (p-1)/(3m+p-1); the simulator agrees for every shape."""
    for p in range(1, 9):
        for m in range(2 * p, 4 * p + 2):
            theory = registry.theory_bubble("dualpipev", p, m, 2)
            assert theory == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
            assert timeline(dualpipev(p, m)).bubble_fraction() == pytest.approx(theory, abs=1e-12)


@pytest.mark.parametrize("p", range(1, 9))
def test_peak_in_flight_is_dualpipes_pp_plus_1(p):
    """DualPipe's activation per device for DualPipeV: PP+1 with PP = 2p stages, in units of
    one stage's activations: every rank holds 2p+1 stage-microbatches at its peak, each half
    of its layers (1F1B on 2p ranks holds 2p on its first)."""
    for m in range(2 * p, 4 * p + 2):
        assert [peak_in_flight(row) for row in dualpipev(p, m).actions] == [2 * p + 1] * p, (p, m)


def test_the_grid_and_the_cells_print():
    """The grid at F = I = W = 1 slot (a cell's F, then its B's two slots); --actions shows the
    cells as torch writes them."""
    built = registry.build("dualpipev", 4, 8)
    grid = render_grid(built, UNIT).splitlines()
    for line, row in zip(grid[1:], dualpipev(4, 8).actions):
        cells = [c for c in line.split()[2:] if c != "."]
        assert cells == [str(a) for a in row for _ in range(2 if a.op is Op.B else 1)]
    text = built.format()
    assert "(0F7;7B3)OVERLAP_F_B" in text and "(4F4;3B0)OVERLAP_F_B" in text
    assert text.count("OVERLAP_F_B") == sum(len(c) for c in dualpipev(4, 8).overlaps)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 9), (4, 16), (8, 16)])
def test_built_schedule_runs_at_its_own_bubble_on_nccl(p, m):
    """Megatron's placement deadlocks on NCCL for V placements (p >= 2): the built list keeps
    the order's own timing."""
    t = simulate(registry.build("dualpipev", p, m), UNIT)
    assert t.bubble_fraction() == pytest.approx(timeline(dualpipev(p, m)).bubble_fraction(), abs=1e-12)


def test_two_stages_per_rank_always():
    assert registry.default_virtual("dualpipev") == 2
    with pytest.raises(ScheduleError, match=r"'dualpipev' places exactly 2 stages on every rank, in a V .* \(got 1\)"):
        registry.build("dualpipev", 2, 4, 1)
