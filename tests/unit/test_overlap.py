"""Overlapped cells (torch's OVERLAP_F_B): a forward and a backward of another microbatch run
as one cell: parsed and printed, their comms grouped, their inputs awaited together, checked
by the validator, placed whole by the lockstep placement."""

from __future__ import annotations

import pytest

from ppx.errors import ScheduleError
from ppx.schedules.comms.lowering import add_comms
from ppx.schedules.comms.program import compile_steps
from ppx.schedules.families.basic import one_f_one_b
from ppx.schedules.ir.action import Action, B, F, parse_cell
from ppx.schedules.placing.placement import lockstep_comms, place_comms
from ppx.schedules.placing.validate import validate
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.simulate import simulate


def overlapped_1f1b(p: int, m: int):
    """1F1B with each steady-state forward and the backward after it (of an earlier
    microbatch) as one cell; the last rank's F, B pairs are of one microbatch and stay apart."""
    plain = one_f_one_b(p, m)
    cells = []
    for row in plain.actions:
        ks = {
            k
            for k in range(len(row) - 1)
            if row[k].op.value == "F" and row[k + 1].op.value == "B" and row[k].mb != row[k + 1].mb
        }
        cells.append(frozenset(ks))
    return plain.__class__(plain.name, m, plain.stage_to_rank, plain.actions, overlaps=tuple(cells))


def test_parse_and_print_a_cell():
    assert parse_cell("(0F3;3B1)OVERLAP_F_B") == (F(0, 3), B(3, 1))
    assert parse_cell(" 2I0") == (Action.parse("2I0"),)
    with pytest.raises(ScheduleError, match="a forward and a backward"):
        parse_cell("(0B3;3F1)OVERLAP_F_B")
    sched = overlapped_1f1b(2, 4)
    assert sched.strings(0) == ["0F0", "(0F1;0B0)OVERLAP_F_B", "(0F2;0B1)OVERLAP_F_B", "(0F3;0B2)OVERLAP_F_B", "0B3"]


def test_a_cells_comms_go_out_together_and_both_inputs_are_awaited_first():
    sched = add_comms(overlapped_1f1b(3, 6))
    validate(sched)
    assert sched.strings(1)[3:8] == ["1RECV_F1", "1RECV_B0", "(1F1;1B0)OVERLAP_F_B", "1SEND_F1", "1SEND_B0"]
    steps = compile_steps(sched.actions[1], 0, sched.cells(1))
    kinds = [(s.kind, str(s.actions[0]) if s.actions else "", s.overlap) for s in steps]
    i = kinds.index(("compute", "1F1", 1))
    assert kinds[i - 2 : i] == [("wait", "1RECV_F1", 0), ("wait", "1RECV_B0", 0)]  # both, before the cell
    assert kinds[i + 1] == ("compute", "1B0", 2)


@pytest.mark.parametrize("lookahead", [-1, 1, 2])
def test_early_receives_never_split_a_cell(lookahead):
    sched = add_comms(overlapped_1f1b(4, 8))
    for r, row in enumerate(sched.actions):
        steps = compile_steps(row, lookahead, sched.cells(r))
        for a, b in zip(steps, steps[1:]):
            if a.overlap == 1:
                assert b.overlap == 2 and b.kind == "compute"


def test_cells_cost_their_two_parts_on_the_simulators_clock():
    plain, cells = add_comms(one_f_one_b(4, 8)), add_comms(overlapped_1f1b(4, 8))
    costs = Costs(fwd=1, bwd=2)
    c, p = simulate(cells, costs), simulate(plain, costs)
    assert c.makespan >= p.makespan  # run one after the other, a cell gains nothing on this clock
    assert list(c.compute) == list(p.compute) == [8 * 3] * 4  # and each part is charged once, at its own cost


def test_the_validator_checks_cells():
    base = overlapped_1f1b(2, 2)
    bad = base.__class__(base.name, 2, base.stage_to_rank, base.actions, overlaps=(frozenset({2}), frozenset()))
    with pytest.raises(ScheduleError, match="a forward then a backward"):
        validate(add_comms(bad))
    own = base.__class__("own", 1, (0,), ((F(0, 0), B(0, 0)),), overlaps=(frozenset({0}),))
    with pytest.raises(ScheduleError, match="cannot hold 0B0, which needs 0F0's output"):
        validate(own)


def test_lockstep_places_a_cell_whole():
    sched = overlapped_1f1b(4, 8)
    placed = lockstep_comms(sched)
    validate(placed)
    for r, row in enumerate(placed.actions):
        computes = [k for k, a in enumerate(row) if a.op.is_compute]
        for c in sched.cells(r):
            assert computes[c + 1] == computes[c] + 1
    assert place_comms(sched).actions == add_comms(sched).actions  # Megatron's placement runs


def test_csv_round_trip_keeps_cells(tmp_path):
    from ppx.schedules.csv_io import read_csv, write_csv

    for sched in (overlapped_1f1b(3, 6), add_comms(overlapped_1f1b(3, 6))):
        write_csv(sched, tmp_path / "s.csv")
        back = read_csv(tmp_path / "s.csv")
        assert back.actions == sched.actions and back.overlaps == sched.overlaps
    text = (tmp_path / "s.csv").read_text()
    assert "(1F1;1B0)OVERLAP_F_B" in text
