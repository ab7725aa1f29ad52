"""The automatic zero-bubble schedule: valid and within its memory limit for any shape, costs
and limit; as fast as ZB-H1 on equal stages; faster than every built-in that fits the same
memory when the last stage is 1.5x slower; a limit below one microbatch refused."""

from __future__ import annotations

import random

import pytest

from ppx.errors import ScheduleError
from ppx.schedules.auto.auto_zb import auto_zb
from ppx.schedules.ir.action import Op
from ppx.schedules.placing.placement import place_comms
from ppx.schedules.registry import FAMILIES
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.memory import peak_held
from ppx.schedules.sim.simulate import simulate

ONE_STAGE_PER_RANK = ("naive", "gpipe", "1f1b", "zb_h1", "zb_h2")


def step(schedule, costs) -> float:
    return simulate(place_comms(schedule, "nccl"), costs).makespan


def random_case(seed: int):
    """(p, m, costs, act_bytes, mem_limit): per-stage costs, with or without W, per-stage saved
    bytes and a per-rank limit from one microbatch (tight) to all of them (loose), or None."""
    rng = random.Random(seed)
    p, m = rng.randint(1, 6), rng.randint(1, 12)
    fwd = [rng.uniform(0.5, 2) for _ in range(p)]
    bwd = [f * rng.uniform(1, 2) for f in fwd]
    wgrad = [f * rng.uniform(0.3, 1.5) for f in fwd] if seed % 3 else 0.0
    costs = Costs(fwd, bwd, wgrad, p2p=rng.choice([0.0, 0.05]), overhead=rng.choice([0.0, 0.02]))
    act = [rng.uniform(1, 4) for _ in range(p)]
    kind = seed % 4
    limit = (
        None
        if kind == 0
        else [a * rng.uniform(1, 2) for a in act]
        if kind == 1
        else max(act) * rng.randint(1, 2 * p)
        if kind == 2
        else sum(act) * m
    )
    return p, m, costs, act, limit


@pytest.mark.parametrize("seed", range(40))
def test_valid_complete_and_within_the_memory_limit(seed):
    p, m, costs, act, limit = random_case(seed)
    s = auto_zb(p, m, costs, act, limit)
    assert s.name == "zb_auto" and s.stage_to_rank == tuple(range(p)) and s.num_microbatches == m
    for transport in ("nccl", "gloo"):
        simulate(place_comms(s, transport), costs, transport)  # validated; raises on deadlock
    for r, row in enumerate(s.actions):
        assert all(a.stage == r and a.op.is_compute for a in row)
        ops = {op: sorted(a.mb for a in row if a.op is op) for op in Op if op.is_compute}
        assert ops[Op.F] == list(range(m))
        if ops[Op.B] or costs.work(row[0]._replace(op=Op.W)) == 0:  # full backwards; always without W
            assert ops[Op.B] == list(range(m)) and not ops[Op.I] and not ops[Op.W]
        else:
            assert ops[Op.I] == ops[Op.W] == list(range(m))
    limits = [min(p - r, m) * act[r] for r in range(p)] if limit is None else limit
    limits = limits if isinstance(limits, list) else [limits] * p
    for r, (peak, lim) in enumerate(zip(peak_held(s, act), limits)):
        assert peak <= lim * (1 + 1e-9), f"rank {r} holds {peak} > its limit {lim}"


def test_equal_stages_at_1f1bs_memory_as_fast_as_zb_h1():
    """t_f = t_b = t_w, the limit 1F1B's peak (p microbatches, ZB-H1's memory)."""
    p, m, costs = 4, 8, Costs(1, 1, 1)
    zb = FAMILIES["zb_h1"].make(p, m, 1)
    s = auto_zb(p, m, costs, mem_limit=float(p))
    assert max(peak_held(zb, [1] * p)) == p
    assert step(s, costs) <= step(zb, costs), (step(s, costs), step(zb, costs))


def last_stage_slower(p: int) -> Costs:
    slow = [1.0] * (p - 1) + [1.5]
    return Costs(slow, slow, slow)


def fitting_builtins(p: int, m: int, limits: list[float], costs: Costs) -> dict[str, float]:
    """The predicted step of every one-stage-per-rank built-in whose peak fits ``limits``."""
    out = {}
    for name in ONE_STAGE_PER_RANK:
        s = FAMILIES[name].make(p, m, 1)
        if all(h <= lim for h, lim in zip(peak_held(s, [1] * p), limits)):
            out[name] = step(s, costs)
    return out


def test_last_stage_slower_beats_every_builtin_within_1f1bs_memory():
    """The last stage 1.5x slower (F, I and W), each rank limited to 1F1B's own peak on it
    (min(p - r, m) microbatches): strictly faster than every built-in that fits (ZB-H1 and
    ZB-H2 hold p and 2p-1 on every rank, so they do not)."""
    p, m, costs = 4, 8, last_stage_slower(4)
    s = auto_zb(p, m, costs)
    mine, theirs = step(s, costs), fitting_builtins(p, m, [min(p - r, m) for r in range(p)], costs)
    assert peak_held(s, [1] * p) == [4, 3, 2, 1]
    assert {"naive", "1f1b"} <= set(theirs)
    assert all(mine < t for t in theirs.values()), f"zb_auto {mine} vs {theirs}"


def test_last_stage_slower_at_zb_h1s_memory_reaches_the_bound():
    """With p microbatches on every rank (ZB-H1's memory) nothing beats ZB-H1 there: the last
    rank starts after p-1 forwards and then works 4.5 m units, which ZB-H1 already reaches;
    zb_auto reaches it too, and is no slower than any built-in that fits."""
    p, m, costs = 4, 8, last_stage_slower(4)
    s = auto_zb(p, m, costs, mem_limit=float(p))
    mine, theirs = step(s, costs), fitting_builtins(p, m, [p] * p, costs)
    assert "zb_h1" in theirs and mine == pytest.approx((p - 1) + 4.5 * m)
    assert all(mine <= t for t in theirs.values()), f"zb_auto {mine} vs {theirs}"


def test_a_limit_below_one_microbatch_is_refused():
    # bytes read as sizes; without act_bytes the limit counts microbatches
    with pytest.raises(
        ScheduleError, match=r"rank 1's memory limit 50.0 MiB is below one microbatch's saved activations \(64.0 MiB\)"
    ):
        auto_zb(2, 4, Costs(1, 1, 1), act_bytes=[2**20, 2**26], mem_limit=50 * 2**20)
    with pytest.raises(ScheduleError, match=r"rank 0's memory limit 0.5 microbatches is below .* \(1 microbatch\)"):
        auto_zb(2, 4, Costs(1, 1, 1), mem_limit=0.5)
    with pytest.raises(ScheduleError, match="act_bytes must be 3 sizes"):
        auto_zb(3, 4, Costs(1, 1, 1), act_bytes=[1, 2])


@pytest.mark.parametrize("seed", range(6))
def test_never_slower_than_a_builtin_that_fits(seed):
    """Random per-stage costs and limits: no one-stage-per-rank built-in within the limit
    simulates faster (the handcrafted orders are the refinement's floor)."""
    p, m, costs, act, limit = random_case(100 + seed)
    limits = [min(p - r, m) * act[r] for r in range(p)] if limit is None else limit
    limits = limits if isinstance(limits, list) else [limits] * p
    mine = step(auto_zb(p, m, costs, act, limit), costs)
    for name in ONE_STAGE_PER_RANK:
        s = FAMILIES[name].make(p, m, 1)
        if all(h <= lim * (1 + 1e-9) for h, lim in zip(peak_held(s, act), limits)):
            assert mine <= step(s, costs) * (1 + 1e-9), (name, mine, step(s, costs))
