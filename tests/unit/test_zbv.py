"""ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, its ZB-V schedule):
ppx's list is torch's ScheduleZBVZeroBubble order, two stages per rank in V placement; it
validates for every shape; its bubble is the authors' closed form (zero with T_F = T_B = T_W,
here at zero communication: the simulator on gloo with every receive posted up front) and its
peak memory their 1F1B figure, p microbatches' worth."""

from __future__ import annotations

import pytest

from helpers.schedule_checks import UNIT, peak_in_flight
from helpers.schedule_checks import own_timeline as timeline
from helpers.torch_orders import torch_order
from ppx import config
from ppx.errors import ScheduleError, UserError
from ppx.schedules import Costs, registry, simulate
from ppx.schedules.families.zbv import v_stage_to_rank, zbv
from ppx.schedules.grid import render_grid

CLASS = "ScheduleZBVZeroBubble"


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_order_is_torchs(p):
    """Equal to the installed torch's, also below 2p-1 microbatches, where torch builds the
    order for 2p-1 and drops the microbatches >= m."""
    for m in sorted({1, 2, p, p + 1, 2 * p - 2, 2 * p, 4 * p} - {0}):
        mine, theirs = zbv(p, m), torch_order(CLASS, p, m, 2)
        assert mine.stage_to_rank == theirs.stage_to_rank == v_stage_to_rank(p), (p, m)
        assert mine.actions == theirs.actions, (p, m)


def test_v_placement():
    assert v_stage_to_rank(4) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert v_stage_to_rank(1) == (0, 0)


def test_order_on_the_ranks():
    rows = [" ".join(map(str, row)) for row in zbv(2, 4).actions]
    assert rows == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3",
    ]


# p = 1..8 placed for NCCL; for gloo to p = 4, as in test_looped_bfs and test_interleaved_zb
@pytest.mark.parametrize("transport,ps", [("nccl", range(1, 9)), ("gloo", range(1, 5))])
def test_the_validator_passes_for_every_shape(transport, ps):
    for p in ps:
        for m in range(1, 4 * p + 2):
            built = registry.build("zbv", p, m, None, transport)  # placed, validated
            assert built.stages_per_rank == 2 and built.stage_to_rank == v_stage_to_rank(p)
            assert built.compute_only().actions == zbv(p, m).actions


@pytest.mark.parametrize("p", range(1, 9))
def test_bubble_is_the_authors_closed_form(p):
    """T_F = T_B = T_W, m >= 2p-1: no rank idles between its first forward and its last W (the
    authors' zero bubble); a synchronous step still counts the skew, rank r starting r slots
    late and ending p-1-r slots before the last: p-1 idle slots per rank besides its 6m,
    (p-1)/(6m+p-1), what the registry gives."""
    for m in sorted({2 * p - 1, 2 * p, 3 * p + 1, 4 * p}):
        t = timeline(zbv(p, m))
        assert [ev[0].start for ev in t.events] == list(range(p))
        assert [ev[-1].end - ev[0].start for ev in t.events] == [6 * m] * p
        assert t.bubble_fraction() == pytest.approx((p - 1) / (6 * m + p - 1), abs=1e-12)
        assert registry.theory_bubble("zbv", p, m, 2) == (p - 1) / (6 * m + p - 1)


def test_fewer_microbatches_are_simulated():
    """Below 2p-1 torch's warmup is not filled: the registry's theory is the simulator's, which
    still comes out as (p-1)/(6m+p-1) from m = floor(3p/2), and more below."""
    for p in range(2, 9):
        for m in range(1, 2 * p - 1):
            bubble = timeline(zbv(p, m)).bubble_fraction()
            assert registry.theory_bubble("zbv", p, m, 2) == pytest.approx(bubble, abs=1e-12)
            if m >= 3 * p // 2:
                assert bubble == pytest.approx((p - 1) / (6 * m + p - 1), abs=1e-12)
            else:
                assert bubble > (p - 1) / (6 * m + p - 1)


@pytest.mark.parametrize("tf,tb,tw", [(2, 2, 1), (1, 2, 1), (2, 3, 1), (3, 3, 2), (3, 4, 2), (1, 1.5, 0.5)])
def test_unequal_times_are_simulated(tf, tb, tw):
    """The authors give no closed form off T_F = T_B = T_W; with T_W <= T_F <= T_B the fixed
    order's longest rank idles 2(p-1)(T_B-T_W) between its first action and its last (the
    simulator's: zero only when T_B = T_W)."""
    costs = Costs(fwd=tf, bwd=tb, wgrad=tw)
    for p in (2, 3, 4, 8):
        for m in (2 * p - 1, 2 * p, 4 * p):
            t = timeline(zbv(p, m), costs)
            longest = max(ev[-1].end - ev[0].start for ev in t.events)
            assert longest - 2 * m * (tf + tb + tw) == pytest.approx(2 * (p - 1) * (tb - tw))


@pytest.mark.parametrize("p", range(1, 9))
def test_peak_in_flight_is_1f1bs(p):
    """The authors' memory: 1F1B's p M_B. Once m >= 2p-1 every rank holds 2p stage-microbatches
    at its peak, each of half its layers: p microbatches' worth, 1F1B's rank 0. Fewer: rank r
    holds min(m+1+r, 2m, 2p)."""
    for m in range(1, 4 * p + 2):
        peaks = [peak_in_flight(row) for row in zbv(p, m).actions]
        assert peaks == [min(m + 1 + r, 2 * m, 2 * p) for r in range(p)], (p, m)
        if m >= 2 * p - 1:
            assert peaks == [2 * p] * p


def test_the_grid_prints():
    """Rank r starts r slots late and ends 3-r early, busy in between."""
    grid = render_grid(registry.build("zbv", 4, 8), UNIT).splitlines()
    for r, (line, row) in enumerate(zip(grid[1:], zbv(4, 8).actions)):
        assert line.split()[2:] == ["."] * r + list(map(str, row)) + ["."] * (3 - r)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 16), (8, 16), (4, 7), (4, 3), (8, 5)])
def test_built_schedule_runs_at_its_own_bubble_on_nccl(p, m):
    """Megatron's placement deadlocks on NCCL for V placements (p >= 2, m >= 2): the built list,
    lockstep-placed, keeps the order's own timing."""
    t = simulate(registry.build("zbv", p, m), UNIT)
    assert t.bubble_fraction() == pytest.approx(timeline(zbv(p, m)).bubble_fraction(), abs=1e-12)


def test_two_stages_per_rank_always():
    assert registry.default_virtual("zbv") == 2 and registry.build("zbv", 2, 4).num_stages == 4
    with pytest.raises(ScheduleError, match=r"'zbv' places exactly 2 stages on every rank, in a V .* \(got 3\)"):
        registry.build("zbv", 2, 4, 3)
    with pytest.raises(ScheduleError, match="virtual_stages must be 2 or null"):
        config.load(None, ["pipeline.schedule=zbv", "pipeline.virtual_stages=1", "pipeline.stages=2"])
    with pytest.raises(ScheduleError, match="virtual_stages must be 2 or null"):  # before 6 stages meet 4 layers
        config.load(None, ["pipeline.schedule=zbv", "pipeline.virtual_stages=3", "pipeline.stages=2"])
    cfg = config.load(None, ["pipeline.schedule=zbv", "pipeline.stages=2", "pipeline.microbatches=4"])
    assert config.virtual_stages(cfg) == 2 and config.resolve_schedule(cfg).stage_to_rank == (0, 1, 1, 0)
    # more stages than layers: the count named as the V makes it (it said "4 stages" of pipeline.stages=2)
    with pytest.raises(UserError) as e:
        config.load(None, ["pipeline.schedule=zbv", "pipeline.stages=2", "model.layers=2"])
    assert str(e.value) == (
        "4 stages (pipeline.stages=2 x 2 stages a rank, zbv) but model.layers=2: every stage needs at least one layer"
    )
