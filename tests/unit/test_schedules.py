"""Schedules are data: every built-in validates, simulates to its theoretical bubble, prints
as a grid and survives a CSV round trip."""

from __future__ import annotations

import pytest

from ppx import schedules
from ppx.errors import ScheduleError
from ppx.schedules import Costs, Op

FAMILIES = list(schedules.FAMILIES)
# each family's costs in the simulator: t_b = 2 t_f, except the zero-bubble ones (t_f = t_b =
# t_w, the backward split into I and W) and interleaved (t_f = t_b per stage)
COSTS = {
    "zb_h1": Costs(fwd=1, bwd=1, wgrad=1),
    "zb_h2": Costs(fwd=1, bwd=1, wgrad=1),
    "interleaved_zb": Costs(fwd=1, bwd=1, wgrad=1),
    "zbv": Costs(fwd=1, bwd=1, wgrad=1),
    "dualpipev": Costs(fwd=1, bwd=1, wgrad=1),
    "interleaved_1f1b": Costs(fwd=1, bwd=1),
}


def closed_form(name: str, p: int, m: int, v: int = 1) -> float:
    """The bubble fraction by its closed form, written out here rather than asked of the registry
    (whose ZB-H1 value is the simulator's own): naive (p-1)/p, fill-drain (p-1)/(m+p-1),
    interleaved (p-1)/(vm+p-1), ZB-H1 (p-1)/(3m+p-1) for m >= p and ZB-H2 the same for
    m >= 2p-1, with t_f = t_b = t_w; looped BFS (p-1)/(vm+p-1) for m >= p, more below;
    interleaved zero bubble (p-1)/(3vm+p-1) for m >= p; ZB-V (p-1)/(6m+p-1) for m >= 2p-1 and
    DualPipeV (p-1)/(3m+p-1) (m >= 2p), with t_f = t_b = t_w (a cell costing F + B)."""
    if name == "naive":
        return (p - 1) / p
    if name in ("gpipe", "1f1b", "forward_only"):
        return (p - 1) / (m + p - 1)
    if name == "interleaved_1f1b":
        return (p - 1) / (v * m + p - 1)
    if name == "zb_h1":
        assert m >= p, "ZB-H1's closed form holds for m >= p"
        return (p - 1) / (3 * m + p - 1)
    if name == "zb_h2":
        assert m >= 2 * p - 1, "ZB-H2's closed form holds for m >= 2p-1"
        return (p - 1) / (3 * m + p - 1)
    if name == "looped_bfs":  # the simulator's, in closed form (test_looped_bfs.py)
        return 1 - v * m / (v * max(m, p) + min(m, p) - 1)
    if name == "interleaved_zb":  # the simulator's (test_interleaved_zb.py)
        assert m >= p, "interleaved zero bubble's closed form holds for m >= p"
        return (p - 1) / (3 * v * m + p - 1)
    if name == "zbv":  # the authors' zero bubble plus the synchronous step's skew (test_zbv.py)
        assert m >= 2 * p - 1, "ZB-V's closed form holds for m >= 2p-1"
        return (p - 1) / (6 * m + p - 1)
    if name == "dualpipev":  # DualPipe's (p-1)(F&B+B-3W) at F = W = 1, B = 2 (test_dualpipev.py)
        return (p - 1) / (3 * m + p - 1)
    raise AssertionError(f"no closed form for {name}: add it to this test")


def test_a_torch_alias_of_a_shape_its_family_refuses_is_named_with_it():
    """(torch_interleaved1f1b at m=3 said only ``interleaved_1f1b needs ...``: another schedule.)"""
    with pytest.raises(ScheduleError) as e:
        schedules.build("torch_interleaved1f1b", 2, 3)
    assert str(e.value).startswith("torch_interleaved1f1b (as interleaved_1f1b): interleaved_1f1b needs pipeline.")
    # torch's own rules beside its family's: Schedule1F1B refused m < p after the ranks had started
    with pytest.raises(ScheduleError, match=r"torch_1f1b needs pipeline.microbatches \(3\) >= pipeline.stages \(4\)"):
        schedules.build("torch_1f1b", 4, 3)
    assert schedules.build("1f1b", 4, 3) and schedules.build("torch_1f1b", 4, 4)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_builtin_schedules_validate_and_match_theory(name, p, m):
    v = schedules.default_virtual(name)
    if name == "interleaved_1f1b" and m % p:
        with pytest.raises(ScheduleError, match="multiple of pipeline.stages"):
            schedules.build(name, p, m, v)
        return
    if name == "dualpipev" and m < 2 * p:
        with pytest.raises(ScheduleError, match="dualpipev needs pipeline.microbatches >= 2 x pipeline.stages"):
            schedules.build(name, p, m, v)
        return
    sched = schedules.build(name, p, m, v)  # validates (including the deadlock dry run)
    assert sched.num_ranks == p and sched.num_microbatches == m and sched.num_stages == p * v
    bubble = schedules.simulate(sched, COSTS.get(name, Costs(fwd=1, bwd=2))).bubble_fraction()
    if name == "zb_h1" and m < p:
        # too few microbatches for the W's to fill the fill and drain: more idle than the
        # closed form, still less than 1F1B's (p-1)/(m+p-1)
        assert (p - 1) / (3 * m + p - 1) < bubble < closed_form("1f1b", p, m)
        return
    if name in ("zb_h2", "looped_bfs", "interleaved_zb", "zbv"):
        # the theory is the order's own timing; NCCL's in-order batches may add waits to it
        # where the placement is add_comms' (test_zb_h2.py, test_looped_bfs.py, ...)
        theory = schedules.theory_bubble(name, p, m, v)
        assert bubble >= theory - 1e-12
        if name == "zb_h2" and m < 2 * p - 1:  # too few microbatches to fill the parallelogram
            assert (p - 1) / (3 * m + p - 1) <= theory < closed_form("1f1b", p, m)
        elif name == "zbv" and m < 2 * p - 1:  # torch's warmup built for 2p-1, not filled
            assert (p - 1) / (6 * m + p - 1) <= theory
        elif name == "interleaved_zb" and m < p:
            assert theory > (p - 1) / (3 * v * m + p - 1)
        else:
            assert theory == pytest.approx(closed_form(name, p, m, v), abs=1e-12)
        return
    assert bubble == pytest.approx(closed_form(name, p, m, v), abs=1e-12)
    assert schedules.theory_bubble(name, p, m, v) == pytest.approx(closed_form(name, p, m, v), abs=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (3, 6), (4, 4), (5, 7)])
def test_zb_h1_has_a_third_of_1f1b_bubble_at_1f1b_peak_memory(p, m):
    costs = Costs(fwd=1, bwd=1, wgrad=1)
    zb, ref = schedules.build("zb_h1", p, m), schedules.build("1f1b", p, m)
    zb_t, ref_t = schedules.simulate(zb, costs), schedules.simulate(ref, costs)
    assert zb_t.bubble_fraction() == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
    idle = lambda t: t.makespan * p - sum(t.busy(r) for r in range(p))  # noqa: E731
    assert idle(zb_t) == pytest.approx(idle(ref_t) / 3)
    peaks = [_max_in_flight(zb, r) for r in range(p)]
    assert max(peaks) == max(_max_in_flight(ref, r) for r in range(p)) == p


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (4, 16, 2)])
def test_interleaved_bubble_shrinks_by_v(p, m, v):
    t = schedules.simulate(schedules.build("interleaved_1f1b", p, m, v), Costs(fwd=1 / v, bwd=1 / v))
    ref = schedules.simulate(schedules.build("1f1b", p, m), Costs(fwd=1, bwd=1))
    over_ideal = lambda b: b / (1 - b)  # noqa: E731
    assert over_ideal(t.bubble_fraction()) == pytest.approx((p - 1) / (v * m))
    assert over_ideal(t.bubble_fraction()) == pytest.approx(over_ideal(ref.bubble_fraction()) / v)


def test_virtual_stages_only_for_interleaved():
    with pytest.raises(ScheduleError, match="runs one stage per rank: pipeline.virtual_stages must be 1"):
        schedules.build("1f1b", 2, 4, 2)
    with pytest.raises(ScheduleError, match="zbv and dualpipev two in a V"):
        schedules.build("zb_h1", 2, 4, 3)
    for name in ("zbv", "dualpipev"):  # two stages per rank, always
        with pytest.raises(ScheduleError, match="places exactly 2 stages on every rank, in a V"):
            schedules.build(name, 2, 4, 3)


def _max_in_flight(sched, rank):
    live = peak = 0
    for a in sched.actions[rank]:
        if a.op is Op.F:
            live += 1
        elif a.op in (Op.B, Op.W):
            live -= 1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (3, 5)])
def test_in_flight_microbatches(p, m):
    one_f_one_b, gpipe = schedules.build("1f1b", p, m), schedules.build("gpipe", p, m)
    for r in range(p):
        assert _max_in_flight(one_f_one_b, r) == min(p - r, m)
        assert _max_in_flight(gpipe, r) == m


def test_1f1b_rank_order_follows_pipedream_flush():
    row = [str(a) for a in schedules.build("1f1b", 4, 6).compute_only().actions[1]]
    assert row == ["1F0", "1F1", "1F2", "1B0", "1F3", "1B1", "1F4", "1B2", "1F5", "1B3", "1B4", "1B5"]


def test_forward_only_has_no_backward():
    sched = schedules.build("forward_only", 3, 4)
    assert not sched.training
    assert all(not a.op.is_backward and a.op not in (Op.SEND_B, Op.RECV_B) for row in sched.actions for a in row)


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(ScheduleError, match="unknown schedule 'zigzag'; choose from naive, gpipe, 1f1b"):
        schedules.build("zigzag", 2, 2)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_stage_takes_its_microbatches_gradients_in_microbatch_order(name):
    """A stage's gradients are the sum of its microbatches', and fp32 addition in another order
    rounds differently: with every schedule adding them in microbatch order (its backwards, or
    its I and its W each), every schedule gives one process's gradients to the bit (looped_bfs
    took torch's order, last to first, and did not)."""
    built = 0
    for p, m, v in [(1, 4, None), (2, 4, None), (2, 8, 3), (3, 6, None), (4, 8, None), (4, 16, 4)]:
        fam = schedules.FAMILIES[name]
        v = v if v is not None and fam.virtual else fam.default_virtual  # (the V families take 2 only)
        if fam.shape_error(p, m, v):  # a shape the family refuses, by its own rule
            continue
        sched = schedules.build(name, p, m, v)  # any other shape must build and validate
        built += 1
        for s in range(sched.num_stages):
            row = sched.actions[sched.stage_to_rank[s]]
            for ops in ((Op.B, Op.I), (Op.W,)):
                mbs = [a.mb for a in row if a.stage == s and a.op in ops]
                assert mbs == sorted(mbs), f"{name} p={p} m={m} v={v} stage {s}: {ops[0].name} in order {mbs}"
    assert built


@pytest.mark.parametrize(
    "name,p,m", [("zb_h1", 2, 8), ("zb_h1", 4, 8), ("zb_h2", 4, 8), ("zbv", 2, 8), ("interleaved_zb", 2, 4)]
)
def test_drain_only_splits_where_a_w_follows_the_stages_last_forward(name, p, m):
    """train.split_backward=drain's list: each I whose W the rank runs before its stage's last F
    becomes a B at the I's place and its W goes; the rest, and every other action, stay."""
    from ppx.schedules.ir.structure import drain_only

    zb = schedules.build(name, p, m)
    got = drain_only(zb)
    schedules.validate(got)
    assert got.name == zb.name and got.splits_backward
    for row, new in zip(zb.actions, got.actions):
        last_f = {a.stage: k for k, a in enumerate(row) if a.op is Op.F}
        kept = {(a.stage, a.mb) for k, a in enumerate(row) if a.op is Op.W and k > last_f[a.stage]}
        want = [
            a._replace(op=Op.B) if a.op is Op.I and (a.stage, a.mb) not in kept else a
            for a in row
            if not (a.op is Op.W and (a.stage, a.mb) not in kept)
        ]
        assert list(new) == want
    assert any(a.op is Op.B for row in got.actions for a in row)  # (at these m some W precedes a last F)


def test_drain_only_on_zb_h1_p4_m8_as_drawn():
    """The rule pinned on one list, row by row: each rank splits only the microbatches whose W
    it runs after its last F (ranks 1-3: 4-7), the rest whole B's; rank 0's pairs stay."""
    from ppx.schedules.ir.structure import drain_only

    rows = [
        " ".join(str(a)[1:] for a in row if a.op.is_compute)
        for row in drain_only(schedules.build("zb_h1", 4, 8)).actions
    ]
    assert rows == [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 I4 W4 I5 W5 I6 W6 I7 W7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 I4 F7 I5 W4 I6 W5 I7 W6 W7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 I4 F6 I5 F7 I6 W4 I7 W5 W6 W7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 I4 F5 I5 F6 I6 F7 I7 W4 W5 W6 W7",
    ]


def test_drain_only_leaves_lists_without_a_split_and_ranks_with_cells():
    from ppx.schedules.ir.structure import drain_only

    one = schedules.build("1f1b", 2, 4)
    assert drain_only(one) is one
    dual = schedules.build("dualpipev", 2, 8)
    assert drain_only(dual).actions == dual.actions  # every rank has overlapped cells


def test_whole_backward_stages_are_those_whose_every_i_is_followed_at_once_by_its_w():
    """ZB-H1's first stage sends nothing upstream, so each of its I's is followed at once by
    its W: it may run whole. The last stage defers its W's; a send between an I and its W, or
    one I whose W is elsewhere, or overlapped cells on the rank, keep a stage split."""
    from ppx.schedules.ir.action import Action
    from ppx.schedules.ir.structure import whole_backward_stages

    zb = schedules.build("zb_h1", 2, 8, None, "gloo")
    assert [whole_backward_stages(zb, r) for r in range(2)] == [{0}, set()]
    assert [whole_backward_stages(schedules.build("zbv", 2, 8, None, "gloo"), r) for r in range(2)] == [{0}, set()]
    assert whole_backward_stages(schedules.build("1f1b", 2, 8, None, "gloo"), 0) == set()  # no I at all
    few = schedules.build("zbv", 2, 2, None, "gloo")  # stage p's gradient goes to stage p-1 on its own rank
    assert [whole_backward_stages(few, r) for r in range(2)] == [{0}, {2}]
    assert all(not whole_backward_stages(schedules.build("dualpipev", 2, 8), r) for r in range(2))  # cells
    row = list(zb.actions[0])
    i = next(k for k, a in enumerate(row) if a.op is Op.I)
    send = Action(0, Op.SEND_B, row[i].mb)
    moved = zb.with_actions([row[: i + 1] + [send] + row[i + 1 :], zb.actions[1]])  # (not valid: only read)
    assert whole_backward_stages(moved, 0) == set()
    w = next(k for k, a in enumerate(row) if a.op is Op.W and a.mb == row[i].mb)
    late = row[:w] + row[w + 1 :]
    late.insert(len(late) - 1, row[w])  # one W away from its I
    assert whole_backward_stages(zb.with_actions([late, zb.actions[1]]), 0) == set()


@pytest.mark.parametrize("name", ["zb_h1", "zb_h2", "interleaved_zb", "zbv"])
@pytest.mark.parametrize("transport", ["nccl", "gloo"])
def test_a_drained_list_is_placed_for_its_own_order(name, transport):
    """train.split_backward=drain's list has its sends and receives placed for its order: as
    fast as that order read back from its CSV (placed anew), at unit and unequal costs; it kept
    the built list's placement (interleaved_zb p=4 m=8 on NCCL: 14.3% bubble against 11.1%)."""
    from ppx.schedules import Costs, drained
    from ppx.schedules.ir.structure import drain_only
    from ppx.schedules.placing.placement import place_comms

    built = schedules.build(name, 4, 8, transport=transport)
    got = drained(built, transport)
    assert got.compute_only().actions == drain_only(built).compute_only().actions
    again = place_comms(got.compute_only(), transport)
    for costs in (Costs(1.0, 1.0, 1.0), Costs(10.0, 12.0, 7.0, p2p=0.3)):
        step = schedules.simulate(got, costs, transport).makespan
        assert step == pytest.approx(schedules.simulate(again, costs, transport).makespan)
