"""The fast simulator, placement and validation against the pre-speedup reference
(tests/helpers/reference_schedules): the same timelines, placed schedules and error texts
on small cases of every family and shape, both transports, every cost kind."""

from __future__ import annotations

import random
import statistics

import pytest

from helpers.reference_schedules import memory as old_memory
from helpers.reference_schedules import placement as old_placement
from helpers.reference_schedules import simulate as old_simulate
from helpers.reference_schedules import validate as old_validate
from ppx.errors import ScheduleError
from ppx.schedules import FAMILIES, Action, Costs, SampledCosts, Schedule, csv_io
from ppx.schedules.comms.lowering import add_comms
from ppx.schedules.placing.placement import place_comms
from ppx.schedules.placing.validate import validate
from ppx.schedules.sim import memory
from ppx.schedules.sim.simulate import simulate

TRANSPORTS = [("nccl", 0), ("gloo", 0), ("gloo", 1), ("gloo", -1)]


def shapes(name: str):
    """(p, m, v) of ``name`` for p in 1..5, m below, at and above p, v in 1..3 if it takes
    any (2 from p = 4 on)."""
    fam = FAMILIES[name]
    for p in range(1, 6):
        for m in sorted({max(p - 1, 1), p, 2 * p + 1}):
            for v in ((1, 2, 3) if p < 4 else (2,)) if fam.virtual else (fam.default_virtual,):
                if fam.shape_error(p, m, v) is None:
                    yield p, m, v


def costs_for(stages: int, seed: int) -> list[Costs]:
    """Equal unit costs, and unequal per-stage ones with every kind of overhead."""
    rnd = random.Random(seed)

    def per_stage(lo, hi):
        return [round(rnd.uniform(lo, hi), 3) for _ in range(stages)]

    uneven = Costs(
        fwd=per_stage(0.5, 2),
        bwd=per_stage(1, 3),
        wgrad=per_stage(0, 1),
        p2p=0.13,
        overhead=0.07,
        send_post=0.011,
        recv_post=0.017,
        reduce=per_stage(0.1, 0.5),
    )
    return [Costs(fwd=1, bwd=1, wgrad=1), uneven]


def same(old, new) -> None:
    """Two timelines equal: every event, each rank's end and its seconds, within 1e-9."""
    assert [[e.action for e in row] for row in new.events] == [[e.action for e in row] for row in old.events]
    for attr in ("rank_end", "compute", "comm", "dp_comm"):
        assert getattr(new, attr) == pytest.approx(getattr(old, attr), rel=1e-9, abs=1e-12), attr
    flat = [t for row in new.events for e in row for t in (e.start, e.end)]
    assert flat == pytest.approx([t for row in old.events for e in row for t in (e.start, e.end)], rel=1e-9, abs=1e-12)
    assert new.makespan == pytest.approx(old.makespan, rel=1e-9, abs=1e-12)


def timed(fn, *args):
    """A simulation's events and per-rank figures, or its ScheduleError's text."""
    t = outcome(fn, *args)
    if isinstance(t, str):
        return t
    return [[(e.action, e.start, e.end) for e in row] for row in t.events], t.rank_end, t.compute, t.comm, t.dp_comm


def outcome(fn, *args):
    """What ``fn(*args)`` gives: its value, or its ScheduleError's text."""
    try:
        return fn(*args)
    except ScheduleError as e:
        return f"ScheduleError: {e}"


@pytest.mark.parametrize("name", [n for n in FAMILIES])
def test_every_family_simulates_as_before(name):
    for p, m, v in shapes(name):
        sched = FAMILIES[name].make(p, m, v)
        placed = place_comms(sched)
        unit, uneven = costs_for(sched.num_stages, p * 100 + m * 10 + v)
        for j, (transport, lookahead) in enumerate(TRANSPORTS):
            for costs, reduce in ((unit, False), (uneven, j % 2 == 0)):
                args = (placed, costs, transport, lookahead, reduce)
                same(old_simulate.simulate(*args), simulate(*args))


@pytest.mark.parametrize("name", [n for n in FAMILIES])
def test_every_family_places_as_before(name):
    for p, m, v in shapes(name):
        order = FAMILIES[name].make(p, m, v)
        for transport in ("nccl", "gloo"):
            old = outcome(old_placement.place_comms, order, transport)
            new = outcome(place_comms, order, transport)
            assert new == old, (p, m, v, transport)


def _random_order(p: int, m: int, split: bool, rng: random.Random, v: int = 1) -> Schedule:
    """A random compute order (any topological order of every stage's work, cut per rank),
    then, half the time, two actions of one rank swapped: some run, some do not."""
    n = p * v
    s2r = tuple(s % p for s in range(n))
    ops = ["F", "I", "W"] if split else ["F", "B"]
    done, order = set(), []
    todo = {(s, op, i) for s in range(n) for op in ops for i in range(m)}

    def ready(s, op, i):
        if op == "F":
            return s == 0 or (s - 1, "F", i) in done
        if op in ("B", "I"):
            return (s, "F", i) in done and (s == n - 1 or (s + 1, "B", i) in done or (s + 1, "I", i) in done)
        return (s, "I", i) in done

    while todo:
        pick = rng.choice(sorted(t for t in todo if ready(*t)))
        todo.remove(pick)
        done.add(pick)
        order.append(pick)
    rows = [[] for _ in range(p)]
    for s, op, i in order:
        rows[s2r[s]].append(Action.parse(f"{s}{op}{i}"))
    if rng.random() < 0.5:
        row = rows[rng.randrange(p)]
        j, k = rng.randrange(len(row)), rng.randrange(len(row))
        row[j], row[k] = row[k], row[j]
    return Schedule("random", m, s2r, tuple(tuple(r) for r in rows))


@pytest.mark.parametrize("seed", range(30))
def test_random_orders_place_validate_and_deadlock_as_before(seed):
    rng = random.Random(seed)
    p, m, v = rng.choice([2, 3, 4]), rng.choice([1, 2, 3, 5]), rng.choice([1, 2])
    order = _random_order(p, m, seed % 2 == 1, rng, v)
    for transport in ("nccl", "gloo"):
        old = outcome(old_placement.place_comms, order, transport)
        assert outcome(place_comms, order, transport) == old
        megatron = add_comms(order)  # runs, deadlocks or crosses its channels, as before
        assert outcome(validate, megatron, transport) == outcome(old_validate.validate, megatron, transport)
        for lookahead in (0, 1, -1):  # deadlock messages included
            args = (megatron, Costs(p2p=0.1), transport, lookahead)
            assert timed(simulate, *args) == timed(old_simulate.simulate, *args)


def test_csv_loaded_schedules_simulate_as_before(tmp_path):
    """Written and read back, with and without their comms, overlapped cells included."""
    for name, p, m in (("dualpipev", 3, 6), ("interleaved_1f1b", 2, 4), ("zb_h2", 3, 5)):
        built = place_comms(FAMILIES[name].make(p, m, FAMILIES[name].default_virtual))
        for with_comms in (False, True):
            path = tmp_path / f"{name}_{with_comms}.csv"
            csv_io.write_csv(built if with_comms else built.compute_only(), path)
            for transport, lookahead in TRANSPORTS:
                loaded = csv_io.from_csv(path, transport)
                args = (loaded, costs_for(loaded.num_stages, m)[1], transport, lookahead)
                same(old_simulate.simulate(*args), simulate(*args))


def test_sampled_costs_agree_in_the_mean():
    """Draws are taken in another order (program order, before the run), so single draws
    differ; the means of many agree, and constant samples give the fixed costs' timeline."""
    sched = place_comms(FAMILIES["1f1b"].make(3, 6, 1))
    spread = {f"{s}{op}": vs for s in range(3) for op, vs in (("F", [0.5, 1.5]), ("B", [1.0, 3.0]))}
    for transport, lookahead in TRANSPORTS:
        steps = []
        for module in (old_simulate, None):
            costs = SampledCosts(spread, [0.0, 0.2], [0.05], seed=3, send_post=[0.01], recv_post=[0.02])
            run = module.simulate if module else simulate
            steps.append(statistics.fmean(run(sched, costs, transport, lookahead).makespan for _ in range(150)))
        assert steps[1] == pytest.approx(steps[0], rel=0.03)
        flat = SampledCosts({k: [v[0]] for k, v in spread.items()}, [0.1], [0.05])
        fixed = Costs(fwd=0.5, bwd=1.0, p2p=0.1, overhead=0.05)
        same(old_simulate.simulate(sched, fixed, transport, lookahead), simulate(sched, flat, transport, lookahead))


def test_peak_held_as_before():
    """The cumulative sum over encoded rows gives the loop's peaks, to the last bit."""
    rnd = random.Random(5)
    for name in ("1f1b", "zb_h2", "interleaved_zb", "dualpipev"):
        placed = place_comms(FAMILIES[name].make(3, 6, FAMILIES[name].default_virtual))
        per = [rnd.uniform(1e6, 1e8) for _ in range(placed.num_stages)]
        for share in (0.0, 0.4, [rnd.random() for _ in range(placed.num_stages)]):
            for sched in (placed, placed.compute_only()):
                assert memory.peak_held(sched, per, share) == old_memory.peak_held(sched, per, share)
