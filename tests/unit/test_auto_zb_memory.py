"""The memory accounting zb_auto searches under, against hand counts; orders within the limit
under it; more memory never a slower order (ppx's accounting, I freeing nothing, from p to
6p microbatches; both costs); the steady cost never above the sync one."""

from __future__ import annotations

import pytest

from ppx.errors import ScheduleError
from ppx.schedules.auto.accounting import Memory, memory
from ppx.schedules.auto.auto_zb import auto_zb, timeline_cost
from ppx.schedules.ir.action import B, F, I, W
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.placing.placement import place_comms
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.memory import peak_held
from ppx.schedules.sim.simulate import simulate


def test_walk_against_hand_counts():
    """Stage 0 saves 10 bytes per F, its I frees 0.6 of them; stage 1 saves 4, I frees none."""
    mem = Memory((10.0, 4.0), (0.6, 0.0), (30.0, 8.0))
    rows = [
        [F(0, 0), F(0, 1), I(0, 0), F(0, 2), W(0, 0), I(0, 1), I(0, 2), W(0, 1), W(0, 2)],
        [F(1, 0), I(1, 0), F(1, 1), W(1, 0), B(1, 1)],
    ]
    # rank 0: 10, 20, 14, 24 (peak), 20, 14, 8, 4, 0; rank 1: 4, 4, 8 (peak), 4, 0
    assert mem.peaks(rows) == pytest.approx([24.0, 8.0])
    assert mem.holds(rows)
    assert not Memory((10.0, 4.0), (0.6, 0.0), (23.0, 8.0)).holds(rows)
    # I freeing nothing (ppx's runtime): rank 0 holds 10, 20, 20, 30 (peak), ...
    assert Memory((10.0, 4.0), (0.0, 0.0), (29.0, 8.0)).peaks(rows) == pytest.approx([30.0, 8.0])
    # the simulator's memory model walks the same way
    s = Schedule("hand", 3, (0, 1), tuple(tuple(r) for r in rows))
    assert peak_held(s, [10.0, 4.0], [0.6, 0.0]) == pytest.approx([24.0, 8.0])


def test_bad_accounting_refused():
    with pytest.raises(ScheduleError, match="input_share must be one value or 2"):
        memory(2, 4, None, 2.0, [0.5, 0.5, 0.5])
    with pytest.raises(ScheduleError, match=r"each in \[0, 1\]"):
        memory(2, 4, None, 2.0, 1.5)


@pytest.mark.parametrize("share", [0.0, 0.6])
def test_within_the_limit_under_its_accounting(share):
    p, m = 4, 8
    costs = Costs([1, 1, 1, 1.5], [1, 1, 1, 1.5], [0.5, 0.5, 0.5, 0.75], p2p=0.05)
    act = [3.0, 2.0, 2.0, 1.0]
    for limit in (3.0, 7.0, 12.0):
        s = auto_zb(p, m, costs, act, limit, share)
        assert max(peak_held(s, act, share)) <= limit * (1 + 1e-9)


@pytest.mark.parametrize("cost", ["sync", "steady"])
def test_more_memory_never_slower(cost):
    """ppx's accounting (I frees nothing), p=4, m=16, from p to 6p microbatches per rank."""
    p, m = 4, 16
    costs = Costs(1.0, 1.1, 0.6, p2p=0.03, overhead=0.01)
    steps = []
    for k in range(p, 6 * p + 1, 4):
        s = auto_zb(p, m, costs, None, float(k), 0.0, cost)
        steps.append(timeline_cost(simulate(place_comms(s, "nccl"), costs), cost))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:])), steps
    assert steps[-1] < steps[0]  # the memory is used


def test_steady_cost_never_above_sync():
    costs = Costs(1.0, 1.0, 0.5, p2p=0.05)
    t = simulate(place_comms(auto_zb(4, 8, costs, None, 8.0, 0.0, "steady"), "nccl"), costs)
    assert timeline_cost(t, "steady") <= timeline_cost(t, "sync")
    assert timeline_cost(t, "steady") < timeline_cost(t, "sync")  # the later ranks start later


@pytest.mark.parametrize("seed", range(8))
def test_valid_under_both_transports_with_a_share_and_either_cost(seed):
    """Random shapes, costs and limits, I freeing 0.6 of a microbatch, both costs: the order
    places and simulates under NCCL and gloo (the validator runs in place_comms) and holds
    every microbatch's F, I and W once, within the limit."""
    import random

    from ppx.schedules.ir.action import Op

    rng = random.Random(seed)
    p, m = rng.randint(2, 5), rng.randint(2, 10)
    costs = Costs([rng.uniform(0.5, 2) for _ in range(p)], 1.0, [rng.uniform(0.3, 1) for _ in range(p)], p2p=0.05)
    limit = rng.uniform(1, 2 * p)
    s = auto_zb(p, m, costs, None, limit, 0.6, "steady" if seed % 2 else "sync")
    for transport in ("nccl", "gloo"):
        simulate(place_comms(s, transport), costs, transport)
    for row in s.actions:
        for op in (Op.F, Op.I, Op.W):
            assert sorted(a.mb for a in row if a.op is op) == list(range(m))
    assert max(peak_held(s, [1.0] * p, 0.6)) <= limit * (1 + 1e-9)
