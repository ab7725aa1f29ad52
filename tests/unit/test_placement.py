"""Placing sends and receives for any compute order (ppx.schedules.placing.placement): Megatron's
placement where it runs, the lockstep one where it would deadlock, and transport-aware checks."""

from __future__ import annotations

import random

import pytest

from helpers.schedule_checks import UNIT, own_bubble
from helpers.torch_orders import torch_order
from ppx.errors import ScheduleError
from ppx.schedules.comms.lowering import add_comms
from ppx.schedules.ir.action import Action, B, F, Op
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.placing.placement import lockstep_comms, place_comms
from ppx.schedules.placing.validate import validate
from ppx.schedules.sim.simulate import simulate

SHAPES = [(p, m) for p in (2, 4, 8) for m in (p, 2 * p, 4 * p)]


TORCH_CLASSES = {  # torch 2.13's schedule classes whose orders run -> stages per rank
    "ScheduleGPipe": 1,
    "ScheduleInterleaved1F1B": 2,
    "ScheduleLoopedBFS": 2,
    "ScheduleInterleavedZeroBubble": 2,
    "ScheduleZBVZeroBubble": 2,
    "ScheduleDualPipeV": 2,
}


@pytest.mark.parametrize("cls", TORCH_CLASSES)
@pytest.mark.parametrize("p,m", SHAPES)
def test_torchs_orders_load_validate_print_and_keep_their_own_bubble(cls, p, m, tmp_path):
    try:
        order = torch_order(cls, p, m, TORCH_CLASSES[cls])
    except ValueError as e:  # shapes torch does not build (DualPipeV needs m >= 2p)
        pytest.skip(f"torch refuses: {e}")
    from ppx.schedules.csv_io import from_csv, write_csv
    from ppx.schedules.grid import render_grid

    write_csv(order, tmp_path / "order.csv")  # compute-only, as torch writes it
    for transport in ("nccl", "gloo"):
        placed = from_csv(tmp_path / "order.csv", transport)
        assert placed.compute_only().actions == order.actions and placed.overlaps == order.overlaps
        validate(placed, transport)
        assert render_grid(placed, UNIT, transport).count("\nrank ") == p
    # its own bubble: every request independent, receives posted up front; NCCL's in-order
    # batches cost the placed order nothing
    own = own_bubble(order)
    assert simulate(from_csv(tmp_path / "order.csv"), UNIT, "nccl").bubble_fraction() == pytest.approx(own)


def test_torchs_1f1b_order_is_refused_clearly():
    """torch 2.13's Schedule1F1B order has its last rank run B0 before F0: ppx says so."""
    with pytest.raises(ScheduleError, match=r"rank 3 step \d+ \(3B0\): backward before its forward 3F0"):
        place_comms(torch_order("Schedule1F1B", 4, 8), "nccl")


def test_megatron_placement_deadlocks_torchs_looped_bfs_on_nccl_and_lockstep_does_not():
    order = torch_order("ScheduleLoopedBFS", 4, 8, 2)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(add_comms(order), "nccl")
    validate(add_comms(order), "gloo")  # independent requests: runs as placed
    validate(lockstep_comms(order), "nccl")


def test_builtin_schedules_keep_megatrons_placement():
    from ppx.schedules import registry

    for name in ("gpipe", "1f1b", "zb_h1", "interleaved_1f1b"):
        built = registry.build(name, 4, 8)
        assert built.actions == add_comms(built.compute_only()).actions


def _v_order():
    """p=2 in V placement (stages 0, 3 on rank 0; 1, 2 on rank 1): rank 1 takes stage 3's
    gradient for microbatch 0 before stage 0's activation for microbatch 1."""
    r0 = [F(0, 0), F(0, 1), F(3, 0), B(3, 0), F(3, 1), B(3, 1), B(0, 0), B(0, 1)]
    r1 = [F(1, 0), F(2, 0), B(2, 0), F(1, 1), F(2, 1), B(1, 0), B(2, 1), B(1, 1)]
    return Schedule("v", 2, (0, 1, 1, 0), (tuple(r0), tuple(r1)))


def test_channels_are_per_pair_on_nccl_and_per_kind_on_gloo():
    simple = add_comms(_v_order())
    with pytest.raises(ScheduleError, match=r"rank 0 step 3 \(0SEND_F1\) is matched by rank 1 step 4 \(2RECV_B0\)"):
        validate(simple, "nccl")
    validate(simple, "gloo")  # activations and gradients travel on groups of their own
    assert place_comms(_v_order(), "gloo").actions == simple.actions
    placed = place_comms(_v_order(), "nccl")
    assert placed.actions != simple.actions
    validate(placed, "nccl")


def test_an_order_that_cannot_run_names_every_blocked_rank():
    r0 = [F(0, 0), B(0, 0), F(0, 1), B(0, 1)]
    r1 = [F(1, 0), F(1, 1), B(1, 0), B(1, 1)]
    order = Schedule("cycle", 2, (0, 1), (tuple(r0), tuple(r1)))
    with pytest.raises(ScheduleError) as e:
        place_comms(order, "gloo")
    assert str(e.value) == (
        "compute order deadlocks whatever the transport: rank 0 step 1 (0B0) waits for 1B/I0 on rank 1; "
        "rank 1 step 1 (1F1) waits for 0F1 on rank 0"
    )


def _random_order(p: int, v: int, m: int, split: bool, rng: random.Random) -> Schedule:
    """A random feasible compute order: one random topological order of every stage's work,
    cut into each rank's share (stage s on rank s % p, or, half the time for v = 2, V-shaped)."""
    n = p * v
    s2r = tuple(s % p for s in range(n))
    if v == 2 and rng.random() < 0.5:
        s2r = tuple(s if s < p else 2 * p - 1 - s for s in range(n))
    ops = ["F", "I", "W"] if split else ["F", "B"]
    done, order = set(), []
    todo = {(s, op, i) for s in range(n) for op in ops for i in range(m)}

    def ready(s, op, i):
        if op == "F":
            return s == 0 or (s - 1, "F", i) in done
        if op in ("B", "I"):
            grad = s == n - 1 or (s + 1, "B", i) in done or (s + 1, "I", i) in done
            return (s, "F", i) in done and grad
        return (s, "I", i) in done

    while todo:
        pick = rng.choice(sorted(t for t in todo if ready(*t)))
        todo.remove(pick)
        done.add(pick)
        order.append(pick)
    rows = [[] for _ in range(p)]
    for s, op, i in order:
        rows[s2r[s]].append(Action(s, Op(op), i))
    return Schedule("random", m, s2r, tuple(tuple(r) for r in rows))


@pytest.mark.parametrize("seed", range(60))
def test_every_feasible_compute_order_runs_on_both_transports(seed):
    rng = random.Random(seed)
    p, v, m = rng.choice([2, 3, 4]), rng.choice([1, 2]), rng.choice([1, 2, 3, 5])
    order = _random_order(p, v, m, split=seed % 2 == 1, rng=rng)
    for transport in ("nccl", "gloo"):
        placed = place_comms(order, transport)
        validate(placed, transport)
        assert placed.compute_only().actions == order.actions


def test_a_receive_is_posted_after_the_unit_its_rank_runs_when_the_send_leaves():
    """`receiving_unit`: the unit running at the send (start < sent < end), else the last
    one ended by then (-1: before the first), found by bisection over the units' ends."""
    from ppx.schedules.comms.lockstep import receiving_unit

    times = [(0.0, 1.0), (1.0, 2.0), (3.0, 4.0), (4.0, 4.0)]  # a gap, and a unit of no length
    starts, ends = [s for s, _ in times], [e for _, e in times]
    got = {sent: receiving_unit(starts, ends, sent) for sent in (0.0, 0.5, 1.0, 2.5, 3.5, 4.0, 9.0)}
    assert got == {0.0: -1, 0.5: 0, 1.0: 0, 2.5: 1, 3.5: 2, 4.0: 3, 9.0: 3}
