"""Interleaved zero bubble: ppx's list is torch's ScheduleInterleavedZeroBubble order (ZB1P), with
torch's shape rule; it validates for every shape, its bubble is the simulator's (at zero
communication: the order's own timing) and it holds the paper's ZB-1p memory, 1F1B's p
microbatches, when p divides m."""

from __future__ import annotations

import pytest

from helpers.schedule_checks import UNIT, own_bubble, peak_in_flight
from helpers.torch_orders import torch_order
from ppx.errors import ScheduleError
from ppx.schedules import registry, simulate
from ppx.schedules.families.interleaved_zb import interleaved_zb, rounds, shape_error
from ppx.schedules.grid import render_grid

CLASS = "ScheduleInterleavedZeroBubble"


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("p", [2, 4])
def test_order_is_torchs(p, v):
    for m in (p, 2 * p, 4 * p):
        mine = interleaved_zb(p, m, v)
        theirs = torch_order(CLASS, p, m, v)
        assert mine.stage_to_rank == theirs.stage_to_rank == tuple(s % p for s in range(p * v))
        assert mine.actions == theirs.actions


@pytest.mark.parametrize("p,m,v", [(4, 6, 2), (4, 10, 2), (4, 9, 2), (3, 7, 2), (2, 3, 3), (8, 20, 2)])
def test_shape_rule_is_torchs(p, m, v):
    """torch splits m into max(1, m // p) rounds and refuses an m they do not divide."""
    n = max(1, m // p)
    if m % n:
        with pytest.raises(ValueError, match="multiple of the number of rounds"):
            torch_order(CLASS, p, m, v)
        with pytest.raises(
            ScheduleError, match=f"multiple of its number of rounds max\\(1, m // pipeline.stages\\) = {n}"
        ):
            registry.build("interleaved_zb", p, m, v)
        assert registry.theory_bubble("interleaved_zb", p, m, v) is None
    else:
        assert interleaved_zb(p, m, v).actions == torch_order(CLASS, p, m, v).actions


def test_order_on_the_ranks():
    rows = [" ".join(map(str, row)) for row in interleaved_zb(2, 4, 2).actions]
    assert rows == [
        "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
        "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3",
    ]


@pytest.mark.parametrize(
    "transport,v,ps", [("nccl", 2, range(1, 9)), ("nccl", 3, range(1, 5)), ("gloo", 2, range(1, 5))]
)
def test_the_validator_passes_for_every_shape(transport, v, ps):
    for p in ps:
        for m in range(1, 3 * p + 2):
            if shape_error(p, m, v):
                continue
            built = registry.build("interleaved_zb", p, m, v, transport)  # placed, validated
            assert built.compute_only().actions == interleaved_zb(p, m, v).actions


def test_bubble_is_the_simulators():
    """t_f = t_b = t_w per stage: (p-1)/(3vm+p-1) once m >= p, ZB-H1's with v m for m (a
    third of interleaved 1F1B's idle time); more below."""
    for v in (2, 3):
        for p in range(1, 7):
            for m in range(1, 2 * p + 2):
                if shape_error(p, m, v):
                    continue
                bubble = own_bubble(interleaved_zb(p, m, v))
                assert registry.theory_bubble("interleaved_zb", p, m, v) == pytest.approx(bubble, abs=1e-12)
                if m >= p:
                    assert bubble == pytest.approx((p - 1) / (3 * v * m + p - 1), abs=1e-12)
                else:
                    assert bubble > (p - 1) / (3 * v * m + p - 1)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 16, 3), (8, 16, 2), (4, 6, 2), (4, 2, 2)])
def test_peak_in_flight_is_zb_1p_memory(p, m, v):
    """Every rank holds (v-1) rounds plus p stage-microbatches at its peak (all v m when
    fewer): with p dividing m, v p chunks of 1/v of its layers, p microbatches' worth, the
    paper's ZB-1p limit p M_B, 1F1B's."""
    per_round = rounds(p, m)[1]
    want = min((v - 1) * per_round + p, v * m)
    assert [peak_in_flight(row) for row in interleaved_zb(p, m, v).actions] == [want] * p
    if m % p == 0:
        assert want == v * p


def test_the_grid_prints():
    """p=2, m=4: 24 actions on each rank in 25 slots, one idle: (p-1)/(3vm+p-1) = 1/25."""
    grid = render_grid(registry.build("interleaved_zb", 2, 4, 2), UNIT).splitlines()
    for line, row in zip(grid[1:], interleaved_zb(2, 4, 2).actions):
        cells = line.split()[2:]
        assert [c for c in cells if c != "."] == list(map(str, row)) and len(cells) == 25


@pytest.mark.parametrize(
    "p,m",
    [(2, 2), (4, 4), (4, 8), (4, 3), (8, 16)] + [(8, 7)],
)
def test_built_schedule_runs_at_its_own_bubble_on_nccl(p, m):
    """Placed for NCCL, the built list keeps the order's own timing, also where Megatron's
    placement runs there but holds ranks back (m < p from p = 5: at p=8, m=7, v=2, 23.6% idle
    against the order's 17.6%) and the lockstep one is taken."""
    built = registry.build("interleaved_zb", p, m, 2)
    assert simulate(built, UNIT).bubble_fraction() == pytest.approx(own_bubble(interleaved_zb(p, m, 2)), abs=1e-12)
