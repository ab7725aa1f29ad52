"""Schedules are data: every built-in validates, simulates to its theoretical bubble, prints
as a grid and survives a CSV round trip."""

from __future__ import annotations

import pytest

from ppx import schedules
from helpers import ppx
from ppx.errors import ScheduleError
from ppx.launch.sweep import point_name
from ppx.schedules import Action, Costs, Op
from ppx.schedules.grid import render_grid
from ppx.schedules.lowering import comm_batches

FAMILIES = list(schedules.FAMILIES)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_builtin_schedules_validate_and_match_theory(name, p, m):
    v = 2 if name == "interleaved_1f1b" else 1
    if name == "interleaved_1f1b" and m % p:
        with pytest.raises(ScheduleError, match="multiple of pipeline.stages"):
            schedules.build(name, p, m, v)
        return
    sched = schedules.build(name, p, m, v)  # validates (including the deadlock dry run)
    assert sched.num_ranks == p and sched.num_microbatches == m and sched.num_stages == p * v
    costs = {"zb_h1": Costs(fwd=1, bwd=1, wgrad=1), "interleaved_1f1b": Costs(fwd=1, bwd=1)}.get(name, Costs(fwd=1, bwd=2))
    timeline = schedules.simulate(sched, costs)
    assert timeline.bubble_fraction() == pytest.approx(schedules.theory_bubble(name, p, m, v), abs=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (3, 6)])
def test_zb_h1_has_a_third_of_1f1b_bubble_at_1f1b_peak_memory(p, m):
    costs = Costs(fwd=1, bwd=1, wgrad=1)
    zb, ref = schedules.build("zb_h1", p, m), schedules.build("1f1b", p, m)
    idle = lambda t: t.makespan * p - sum(t.busy(r) for r in range(p))  # noqa: E731
    assert idle(schedules.simulate(zb, costs)) == pytest.approx(idle(schedules.simulate(ref, costs)) / 3)
    assert schedules.theory_bubble("zb_h1", p, m) == pytest.approx((p - 1) / (3 * m + p - 1))
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


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_step_time_is_fill_drain_ideal(name):
    p, m, tf, tb = 4, 8, 10.0, 20.0
    t = schedules.simulate(schedules.build(name, p, m), Costs(fwd=tf, bwd=tb))
    assert t.makespan == pytest.approx((m + p - 1) * (tf + tb))


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


def test_naive_is_stop_and_wait():
    sched = schedules.build("naive", 3, 1)
    t = schedules.simulate(sched, Costs(fwd=1, bwd=1))
    spans = sorted((e.start, str(e.action)) for row in t.events for e in row)
    assert [a for _, a in spans] == ["0F0", "1F0", "2F0", "2B0", "1B0", "0B0"]


def test_forward_only_has_no_backward():
    sched = schedules.build("forward_only", 3, 4)
    assert not sched.training
    assert all(not a.op.is_backward and a.op not in (Op.SEND_B, Op.RECV_B) for row in sched.actions for a in row)


def test_comms_pair_1f1b_send_forward_with_receive_backward():
    row = [str(a) for a in schedules.build("1f1b", 4, 8).actions[1]]
    k = row.index("1SEND_F2")
    assert row[k + 1] == "1RECV_B0"  # posted together in one batch


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)])
@pytest.mark.parametrize("lookahead", [-1, 0, 1, 3])
def test_receives_move_earlier_and_waits_stay_put(name, v, lookahead):
    from ppx.schedules.program import compile_program
    from ppx.schedules.lowering import receive_early

    sched = schedules.build(name, 4, 8, virtual_stages=v)
    for rank, row in enumerate(sched.actions):
        early = receive_early(row, lookahead)
        assert sorted(map(str, early)) == sorted(map(str, row))  # nothing lost or added
        others = lambda r: [a for a in r if a.op.is_compute or a.op.is_send]  # noqa: E731
        assert others(early) == others(row)  # computes and sends keep their order
        recvs = lambda r: [a for a in r if a.op.is_comm and not a.op.is_send]  # noqa: E731
        assert recvs(early) == recvs(row)  # receives keep their order (gloo matches them in order)
        computes_before = lambda r, a: sum(1 for b in r[: r.index(a)] if b.op.is_compute)  # noqa: E731
        for k, a in enumerate(row):
            if a.op.is_comm and not a.op.is_send:
                if lookahead >= 0:
                    assert computes_before(early, a) == max(computes_before(row, a) - lookahead, 0)
                else:  # all at the first wait: after the computes that need no receive
                    first = next(k for k, b in enumerate(row) if b.op.is_comm and not b.op.is_send)
                    assert computes_before(early, a) == computes_before(row, row[first])
        if lookahead != 0:  # moved receives are posted ahead of the sends they land next to, except upfront
            for start, end in comm_batches(early):
                kinds = [b.op.is_send for b in early[start:end]]
                assert kinds == sorted(kinds, reverse=lookahead < 0)
        program = compile_program(row, sched.stage_to_rank, lookahead)
        waits = [it.label.split()[1] for it in program if it.kind == "wait"]
        plain = [it.label.split()[1] for it in compile_program(row, sched.stage_to_rank) if it.kind == "wait"]
        assert waits == plain  # the same blocking points, right before the same computes
        computes = [it for it in program if it.kind == "compute"]
        assert [it.actions[0] for it in computes] == [a for a in row if a.op.is_compute]


def _starts(timeline):
    return {str(e.action): e.start for row in timeline.events for e in row}


def test_gloo_transport_hand_derived():
    # GPipe p=2 m=2, F = B = 1, 0.5 per hand-off. On gloo each message completes on its own,
    # 0.5 after both ends are posted; stage 1 posts 1RECV_F1 when 1F0 ends (2.5) unless the
    # receive is posted one compute early, at the start (then 1F1 starts on arrival, 2.5).
    sched = schedules.build("gpipe", 2, 2)
    costs = Costs(fwd=1, bwd=1, p2p=0.5)
    late = schedules.simulate(sched, costs, "gloo", 0)
    early = schedules.simulate(sched, costs, "gloo", 1)
    assert _starts(late) == {"0F0": 0, "0F1": 1, "1F0": 1.5, "1F1": 3.0, "1B0": 4, "1B1": 5, "0B0": 5.5, "0B1": 7}
    assert _starts(early) == {"0F0": 0, "0F1": 1, "1F0": 1.5, "1F1": 2.5, "1B0": 3.5, "1B1": 4.5, "0B0": 5, "0B1": 6}
    assert (late.makespan, early.makespan) == (8, 7)


def test_posting_costs_time_per_op_and_sends_leave_when_posted():
    # GPipe p=2 m=2 on gloo, lowered lists, F = B = 1, 0.1 per posted op: 0SEND_F0 is out at 1.1,
    # 1RECV_F1 (posted after 1F0 ends at 2.1) at 2.2, 1SEND_B0 at 4.3, 0RECV_B1 (after 0B0) at 5.4
    t = schedules.simulate(schedules.build("gpipe", 2, 2), Costs(fwd=1, bwd=1, send_post=0.1, recv_post=0.1), "gloo", 0)
    want = {"0F0": 0, "0F1": 1.1, "1F0": 1.1, "1F1": 2.2, "1B0": 3.2, "1B1": 4.3, "0B0": 4.3, "0B1": 5.4}
    assert _starts(t) == pytest.approx(want)
    assert t.makespan == pytest.approx(6.4)
    # every receive posted at the rank's first wait: rank 1 posts two (0.2) before 1F0, which still
    # waits for 0SEND_F0; rank 0 posts SEND_F1 first, then both receives
    up = schedules.simulate(schedules.build("gpipe", 2, 2), Costs(fwd=1, bwd=1, send_post=0.1, recv_post=0.1), "gloo", -1)
    assert _starts(up) == pytest.approx(want)


def test_simulated_bubble_splits_time_as_a_run_measures_it():
    # GPipe p=2 m=1 on gloo, F = B = 1, 0.1 per send post, 0.5 latency. Rank 0: 0F0 [0, 1], posts
    # 0SEND_F0 until 1.1; 1SEND_B0 is posted from 3.6 and arrives at 4.2: 0.6 of its wait is
    # transfer, 0B0 [4.2, 5.2]. Rank 1 waits from 0 for 0SEND_F0 (out at 1.1, arrives 1.6: 0.6
    # transfer), 1F0 [1.6, 2.6], 1B0 [2.6, 3.6], posts until 3.7. Each rank: compute 2, comm 0.7.
    t = schedules.simulate(schedules.build("gpipe", 2, 1), Costs(fwd=1, bwd=1, p2p=0.5, send_post=0.1), "gloo", -1)
    assert t.makespan == pytest.approx(5.2)
    assert t.compute == pytest.approx([2.0, 2.0]) and t.comm == pytest.approx([0.7, 0.7])
    assert t.bubble_fraction() == pytest.approx(2 * 2.5 / (2 * 5.2))
    # the runtime's overhead between actions is idle, as a run's gaps are
    o = schedules.simulate(schedules.build("gpipe", 2, 1), Costs(fwd=1, bwd=1, overhead=0.25))
    assert o.compute == [2.0, 2.0] and o.comm == [0.0, 0.0] and o.idle(0) == pytest.approx(o.makespan - 2.0)


def test_sends_leave_when_the_compute_ends_not_after_the_overhead():
    t = schedules.simulate(schedules.build("gpipe", 2, 2), Costs(fwd=1, bwd=1, overhead=0.25))
    assert _starts(t)["1F0"] == 1.0  # 0F0 ends at 1; its 0.25 of runtime overhead follows the send


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)])
def test_transports_agree_without_latency_and_gloo_is_never_slower(name, v):
    sched = schedules.build(name, 4, 8, virtual_stages=v)
    free = Costs(fwd=1, bwd=2, wgrad=1)
    nccl = schedules.simulate(sched, free).makespan
    assert all(schedules.simulate(sched, free, "gloo", k).makespan == pytest.approx(nccl) for k in (0, 1, 3))
    slow = Costs(fwd=1, bwd=2, wgrad=1, p2p=0.3, overhead=0.1)
    strict = schedules.simulate(sched, slow).makespan
    assert schedules.simulate(sched, slow, "gloo", 0).makespan <= strict + 1e-9
    assert schedules.simulate(sched, slow, "gloo", 1).makespan <= schedules.simulate(sched, slow, "gloo", 0).makespan + 1e-9


def test_action_strings_round_trip():
    for text in ["0F1", "1B3", "2I0", "2W0", "0SEND_F1", "1RECV_B0", "12F345"]:
        assert str(Action.parse(text)) == text
    assert Action.parse("3RECV_F2") == Action(3, Op.RECV_F, 2)


@pytest.mark.parametrize("with_comms", [False, True])
def test_csv_round_trip(tmp_path, with_comms):
    sched = schedules.build("1f1b", 3, 4)
    path = tmp_path / "s.csv"
    schedules.write_csv(sched if with_comms else sched.compute_only(), path)
    text = path.read_text().splitlines()
    assert text[0].startswith("0F0,0SEND_F0,0F1," if with_comms else "0F0,0F1,")
    back = schedules.from_csv(path)
    assert back.actions == sched.actions
    assert back.stage_to_rank == sched.stage_to_rank and back.num_microbatches == 4


def test_csv_with_torch_idle_cells(tmp_path):
    path = tmp_path / "idle.csv"
    path.write_text("0F0,,0B0\n,1F0,1B0\n")
    sched = schedules.from_csv(path)
    assert [str(a) for a in sched.compute_only().actions[1]] == ["1F0", "1B0"]


def test_exported_interleaved_csv_runs_as_built(tmp_path):
    """Interleaved batches sends with computes (groups); its CSV keeps the comms so that
    reading it back gives the same, deadlock-free list."""
    path = tmp_path / "il.csv"
    r = ppx("schedule", "interleaved_1f1b", "-p", "3", "-m", "6", "--csv", str(path))
    assert r.returncode == 0 and "with its SEND/RECV actions" in r.stdout, r.stderr
    assert schedules.from_csv(path).actions == schedules.build("interleaved_1f1b", 3, 6, 2).actions


def test_sweep_points_get_distinct_folders():
    assert point_name(["pipeline.schedule=a.csv", "train.lr=0.5"]) == "schedule=a.csv,lr=0.5"
    assert point_name(["train.lr=1.5"]) != point_name(["train.lr=0.5"])


def test_csv_names_a_duplicate_as_written(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1F1,1F1,1B0,1B1\n")
    with pytest.raises(ScheduleError, match=r"rank 1 step 1 \(1F1\): 1F1 appears 2 times"):
        schedules.from_csv(path)


def test_grid_shows_each_rank_and_idle():
    grid = render_grid(schedules.build("gpipe", 2, 2)).splitlines()
    assert grid[0].split() == ["time", "0", "1", "2", "3", "4", "5"]
    assert grid[1].split()[2:] == ["F0", "F1", ".", ".", "B0", "B1"]
    assert grid[2].split()[2:] == [".", "F0", "F1", "B0", "B1", "."]


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(ScheduleError, match="unknown schedule 'zigzag'; choose from naive, gpipe, 1f1b"):
        schedules.build("zigzag", 2, 2)


def test_waits_split_into_idle_before_the_send_and_transfer_after_it():
    from ppx.measure.metrics import step_breakdown

    # rank 0 computes 0F0 over [0, 1] and posts its send at 1.0; rank 1 waits from 0.2 to 1.3:
    # 0.8 s of that is the schedule's idle (nothing sent yet), 0.3 s is transfer
    r0 = {"rank": 0, "start": 0.0, "end": 1.1, "loss": None, "compute_s": 1.0, "comm_s": 0.1, "wait_s": 0.0,
          "spans": [("compute", "0F0", ["0F0"], 0.0, 1.0), ("post", "0SEND_F0", ["0SEND_F0"], 1.0, 1.1)]}
    r1 = {"rank": 1, "start": 0.0, "end": 2.3, "loss": 1.0, "compute_s": 1.0, "comm_s": 0.2, "wait_s": 1.1,
          "spans": [("post", "1RECV_F0", ["1RECV_F0"], 0.0, 0.2), ("wait", "wait 1RECV_F0", ["1RECV_F0"], 0.2, 1.3),
                    ("compute", "1F0", ["1F0"], 1.3, 2.3)]}
    m = step_breakdown([r0, r1], [0, 1])
    one = m["ranks"][1]
    assert one["transfer_s"] == pytest.approx(0.3) and one["post_s"] == pytest.approx(0.2)
    assert one["comm_s"] == pytest.approx(0.5)
    assert one["idle_s"] == pytest.approx(2.3 - 1.0 - 0.5)  # the 0.8 s before the send, plus nothing else
    assert m["ranks"][0]["transfer_s"] == 0.0
    assert step_breakdown([r0, r1])["ranks"][1]["idle_s"] == pytest.approx(2.3 - 1.0 - 0.2)  # no spans: all idle


def test_sampled_costs_match_constants_and_cost_more_when_they_vary():
    from ppx.measure.prediction import predict, predict_expected

    sched = schedules.build("1f1b", 4, 8)
    flat = {f"{s}{op}": [v] for s in range(4) for op, v in (("F", 1.0), ("B", 2.0))}
    for transport, k in (("nccl", 0), ("gloo", 1)):
        sampled = schedules.simulate(sched, schedules.SampledCosts(flat, [0.1], [0.05]), transport, k).makespan
        fixed = schedules.simulate(sched, Costs(fwd=1, bwd=2, p2p=0.1, overhead=0.05), transport, k).makespan
        assert sampled == pytest.approx(fixed)
    # the same means, spread out: a slow action on the critical path costs all of its delay
    spread = {f"{s}{op}": vs for s in range(4) for op, vs in (("F", [0.5, 1.5]), ("B", [1.0, 3.0]))}
    samples = {"action_s": spread, "p2p_s": [0.0, 0.2], "overhead_s": [0.05]}
    expected = predict_expected(sched, samples, "gloo", 1, draws=64, seed=1)["step_time_s"]
    of_means = predict(sched, Costs(fwd=1, bwd=2, p2p=0.1, overhead=0.05), "gloo", 1)["step_time_s"]
    assert expected > of_means * 1.03
    assert predict_expected(sched, samples, "gloo", 1, draws=8, seed=1) == predict_expected(sched, samples, "gloo", 1, draws=8, seed=1)


def test_cost_samples_split_posting_into_sends_and_receives():
    from ppx.measure.prediction import cost_samples, costs_from, mean_costs

    # rank 0: one send alone (0.1 s), then a send and a receive together (0.13 s: the receive gets
    # 0.13 - 0.1); rank 1 posts two receives at once (0.02 each) and waits for 0F0's send
    r0 = [("compute", "0F0", ["0F0"], 0.0, 1.0), ("post", "0SEND_F0", ["0SEND_F0"], 1.0, 1.1),
          ("compute", "0F1", ["0F1"], 1.15, 2.15), ("post", "0SEND_F1 0RECV_B0", ["0SEND_F1", "0RECV_B0"], 2.15, 2.28)]
    r1 = [("post", "1RECV_F0 1RECV_F1", ["1RECV_F0", "1RECV_F1"], 0.0, 0.04),
          ("wait", "wait 1RECV_F0", ["1RECV_F0"], 0.04, 1.3), ("compute", "1F0", ["1F0"], 1.3, 2.3),
          ("wait", "wait 1RECV_F1", ["1RECV_F1"], 2.3, 2.5), ("compute", "1F1", ["1F1"], 2.5, 3.5)]
    sched = schedules.build("gpipe", 2, 2)
    samples = cost_samples([{"step": 0, "ranks": {0: r0, 1: r1}}], sched)
    assert samples["send_post_s"] == pytest.approx([0.1])
    assert samples["recv_post_s"] == pytest.approx([0.02, 0.03])
    assert samples["p2p_s"] == pytest.approx([0.2])  # 0SEND_F0 out at 1.1, waited for until 1.3; 1F1's wait began later
    assert samples["overhead_s"] == pytest.approx([0.025, 0.0])  # rank 0's 0.05 gap over its two computes
    costs = costs_from(mean_costs(samples), 2)
    assert (costs.send_post, costs.recv_post) == pytest.approx((0.1, 0.025))
