"""Looped BFS: ppx's list is torch's ScheduleLoopedBFS order with each stage's backwards in
microbatch order (ppx/schedules/families/looped_bfs.py says why), it validates for every shape, its
bubble is the simulator's (at zero communication: the order's own timing) and it holds every
microbatch on every stage at its peak, as GPipe does."""

from __future__ import annotations

import pytest

from helpers.schedule_checks import own_bubble, peak_in_flight
from helpers.torch_orders import torch_order
from ppx.schedules import Costs, registry, simulate
from ppx.schedules.families.looped_bfs import looped_bfs


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("p", [2, 4])
def test_order_is_torchs_with_each_stages_backwards_in_microbatch_order(p, v):
    for m in (p, 2 * p, 4 * p):
        mine = looped_bfs(p, m, v)
        theirs = torch_order("ScheduleLoopedBFS", p, m, v)
        assert mine.stage_to_rank == theirs.stage_to_rank == tuple(s % p for s in range(p * v))
        for ours, torchs in zip(mine.actions, theirs.actions):
            forwards = [a for a in torchs if a.op.value == "F"]
            backwards = [a for a in torchs if a.op.value == "B"]
            assert backwards == sorted(backwards, key=lambda a: (-a.stage, -a.mb))  # torch's: last to first
            assert ours == tuple(forwards + sorted(backwards, key=lambda a: (-a.stage, a.mb)))


def test_order_on_a_rank():
    row = " ".join(map(str, looped_bfs(2, 3, 2).actions[1]))
    assert row == "1F0 1F1 1F2 3F0 3F1 3F2 3B0 3B1 3B2 1B0 1B1 1B2"


@pytest.mark.parametrize(
    "transport,v,ps", [("nccl", 2, range(1, 9)), ("nccl", 3, range(1, 5)), ("gloo", 2, range(1, 5))]
)
def test_the_validator_passes_for_every_shape(transport, v, ps):
    for p in ps:
        for m in range(1, 3 * p + 2):  # m < p, p <= m < 2p, m >= 2p
            built = registry.build("looped_bfs", p, m, v, transport)  # placed, validated
            assert built.compute_only().actions == looped_bfs(p, m, v).actions


def closed_form(p: int, m: int, v: int) -> float:
    """What the simulator gives: a rank runs v m forwards and v m backwards, and the step
    takes v max(m, p) + min(m, p) - 1 slots of each: p-1 to fill and drain once m >= p
    ((p-1)/(vm+p-1), GPipe's over v times the work), plus p-m per loop when m < p."""
    return 1 - v * m / (v * max(m, p) + min(m, p) - 1)


@pytest.mark.parametrize("costs", [Costs(fwd=1, bwd=1), Costs(fwd=1, bwd=2), Costs(fwd=2, bwd=3)])
def test_bubble_is_the_simulators(costs):
    for v in (2, 3):
        for p in range(1, 7):
            for m in range(1, 2 * p + 2):
                assert own_bubble(looped_bfs(p, m, v), costs) == pytest.approx(closed_form(p, m, v), abs=1e-12)
                if m >= p:
                    assert closed_form(p, m, v) == pytest.approx((p - 1) / (v * m + p - 1))
    assert registry.theory_bubble("looped_bfs", 4, 8, 2) == pytest.approx(3 / 19)
    assert registry.theory_bubble("looped_bfs", 4, 2, 3) == pytest.approx(closed_form(4, 2, 3))


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 3, 3), (8, 16, 2)])
def test_every_microbatch_is_in_flight_on_every_stage_at_the_peak(p, m, v):
    """All v m (stage, microbatch) pairs: v chunks of 1/v of the rank's layers each, so m
    microbatches' worth of the rank's activations, GPipe's figure."""
    assert [peak_in_flight(row) for row in looped_bfs(p, m, v).actions] == [v * m] * p


@pytest.mark.parametrize(
    "p,m",
    [(2, 2), (2, 4), (4, 8), (4, 16)] + [(2, 3), (4, 7)],
)
def test_built_schedule_runs_at_its_own_bubble_on_nccl(p, m):
    """Placed for NCCL, the built list keeps the order's own timing, also where Megatron's
    placement runs there but is slower (p < m < 2p: at p=4, m=7, v=2, 63% idle against the
    order's 18%) and the lockstep one is taken."""
    costs = Costs(fwd=1, bwd=2)
    assert simulate(registry.build("looped_bfs", p, m, 2), costs).bubble_fraction() == pytest.approx(
        closed_form(p, m, 2), abs=1e-12
    )
