"""Schedules as CSV (ppx.schedules.csv_io): round trips with and without comms, torch's idle
cells, and duplicates named as written."""

from __future__ import annotations

import pytest

from ppx import schedules
from ppx.errors import ScheduleError


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


def test_csv_names_a_duplicate_as_written(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1F1,1F1,1B0,1B1\n")
    with pytest.raises(ScheduleError, match=r"dup.csv: rank 1 cell 2 \(1F1\): 1F1 is written twice \(cells 1 and 2\)"):
        schedules.from_csv(path)


def test_csv_that_is_not_utf8_text_is_one_error_and_a_byte_order_mark_is_read_past(tmp_path):
    path = tmp_path / "binary.csv"
    path.write_bytes(b"0F0,0B0\n\xff\xfe1F0,1B0\n")
    with pytest.raises(ScheduleError, match=r"binary.csv is not UTF-8 text \(byte 8: invalid start byte\)"):
        schedules.from_csv(path)
    bom = tmp_path / "bom.csv"
    bom.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", encoding="utf-8-sig")
    assert schedules.from_csv(bom).actions == schedules.build("1f1b", 2, 2).actions


def _before_reduce_grad(rows: list[list[str]]) -> dict[str, str]:
    """For each ``{stage}REDUCE_GRAD``, the stage's own action right before it (receives,
    which torch's lowering and ppx place differently, skipped)."""
    out = {}
    for row in rows:
        for k, cell in enumerate(row):
            if cell.endswith("REDUCE_GRAD"):
                stage = cell[: -len("REDUCE_GRAD")]
                out[cell] = next(c for c in reversed(row[:k]) if "RECV" not in c and c.startswith(stage))
    return out


@pytest.mark.parametrize(
    ("name", "p", "m", "v"), [("1f1b", 3, 4, None), ("zb_h1", 3, 4, None), ("interleaved_1f1b", 2, 4, 2)]
)
def test_reduce_grad_goes_where_torch_puts_it(name, p, m, v):
    # after the stage's last backward *and its gradient send*: before the send, torch's
    # executor would make the send wait for the reduction
    from torch.distributed.pipelining.schedules import _Action, _add_reduce_grad, _add_send_recv

    from ppx.schedules.csv_io import torch_rows

    sched = schedules.build(name, p, m, v)
    compute = {r: [_Action.from_str(str(a)) for a in row] for r, row in enumerate(sched.compute_only().actions)}
    lowered = _add_send_recv(
        {r: _add_reduce_grad(row, m) for r, row in compute.items()},
        stage_to_rank=lambda s: sched.stage_to_rank[s],
        num_stages=sched.num_stages,
    )
    theirs = _before_reduce_grad([[str(a) for a in lowered[r]] for r in sorted(lowered)])
    ours = _before_reduce_grad(torch_rows(sched))
    assert ours == theirs
    if name == "1f1b":
        assert ours == {"0REDUCE_GRAD": "0B3", "1REDUCE_GRAD": "1SEND_B3", "2REDUCE_GRAD": "2SEND_B3"}


@pytest.mark.parametrize(
    "rank1, said",
    [
        ("1F0,1B0,1F1,1B1,1B2,1F2", "rank 1 cell 4 (1B2): backward before its forward 1F2 (cell 5)"),
        ("1F0,1I0,1B0,1F1,1B1", "rank 1 cell 1 (1I0): microbatch 0's backward on stage 1 is written both whole (1B0)"),
        ("1F0,1I0,1F1,1I1,1W1,1B2", "rank 1 cell 1 (1I0): 1I0 has no 1W0: an I's weight gradients come in its W"),
        ("1F0,1W0,1I0,1F1,1B1", "rank 1 cell 1 (1W0): weight gradient before its input gradient 1I0 (cell 2)"),
        ("1F0,1B0,,1F1,1F1,1B1", "rank 1 cell 4 (1F1): 1F1 is written twice (cells 3 and 4)"),  # (empty cells counted)
        ("1F0,1X1", "rank 1 cell 1: cannot parse action '1X1'"),
        ("1F0,1B0,1B1,1F2,1B2", "rank 1 cell 2 (1B1): 1B1 has no forward 1F1 on this rank"),
        ("1F0,1B0,1F2,1B2", "rank 1: stage 1 has no forward of microbatch 1 (1F1)"),
        ("1F0,1F1,1F2,1B0,1B2", "rank 1: stage 1 has no backward of microbatch 1 (1B1, or 1I1 and 1W1)"),
        (
            "(1F0;1B0)OVERLAP_F_B,1F1,1B1",
            "rank 1 cell 0 (1B0): an overlapped cell holds a forward and a backward of two",
        ),
    ],
)
def test_a_csv_order_is_refused_naming_the_cell_as_written(tmp_path, rank1, said):
    """Errors point into the file (rank = row, cell counted from 0 with empty cells), not into
    the list with the sends and receives ppx adds, which the file never held."""
    path = tmp_path / "mine.csv"
    path.write_text("0F0,0F1,0F2,0B0,0B1,0B2\n" + rank1 + "\n")
    with pytest.raises(ScheduleError) as e:
        schedules.from_csv(path)
    assert str(e.value).startswith(f"schedule CSV {path}: {said}"), str(e.value)


def test_a_csv_whose_microbatch_indices_skip_says_how_many_it_runs(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("0F0,0F1,0F2,0F9,0B0,0B1,0B2,0B9\n1F0,1F1,1F2,1F9,1B0,1B1,1B2,1B9\n")
    with pytest.raises(
        ScheduleError, match=r"microbatches 3-8 appear in no cell, where its largest is 9: .* \(10 here\)"
    ):
        schedules.from_csv(path)


def test_a_csv_with_its_own_comms_is_refused_naming_the_cell_and_blank_end_lines_are_no_ranks(tmp_path):
    """The checks of a list with sends and receives written in it name the file's cells (two
    empty ones before 2F0 here); blank lines at the end of a file add no idle rank."""
    path = tmp_path / "il.csv"
    schedules.write_csv(schedules.build("interleaved_1f1b", 2, 4, 2), path)
    text = path.read_text()
    assert "2RECV_F0,2F0," in text
    path.write_text(text.replace("2RECV_F0,2F0,", ",,2F0,2RECV_F0,", 1) + "\n\n")
    with pytest.raises(ScheduleError, match=r"il.csv: rank 0 cell 7 \(2RECV_F0\): no later 2F0 consumes it"):
        schedules.from_csv(path)
    path.write_text(text + "\n\n")
    assert schedules.from_csv(path).num_ranks == 2


def test_an_index_far_beyond_the_file_is_one_line_at_once(tmp_path):
    """A typed 10^9 names what is missing in runs, found from the cells written (it was a list
    of 10^9 numbers: 24 GB, then the kernel's OOM killer, nothing said)."""
    path = tmp_path / "typo.csv"
    path.write_text("0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B999999999\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B999999999\n")
    with pytest.raises(ScheduleError, match=r"typo.csv: microbatches 4-999999998 appear in no cell, where its largest"):
        schedules.from_csv(path)
    path.write_text("0F0,0B0\n1000000000F0,1000000000B0\n")
    with pytest.raises(ScheduleError) as e:
        schedules.from_csv(path)
    assert str(e.value) == f"schedule CSV {path}: stages 1-999999999 have no actions, where its largest is 1000000000"
    path.write_text("0F0,0B0\n2F0,2B0\n4F0,4B0\n")
    with pytest.raises(ScheduleError, match=r"stages 1, 3 have no actions, where its largest is 4$"):
        schedules.from_csv(path)


def test_a_file_larger_than_ppx_builds_is_refused_as_a_family_would_be(tmp_path):
    from ppx.schedules.registry import MAX_STAGE_MICROBATCHES

    m = MAX_STAGE_MICROBATCHES // 2 + 1
    path = tmp_path / "big.csv"
    path.write_text(",".join(f"{s}F{k}" for s in (0, 1) for k in range(m)) + "\n")
    with pytest.raises(ScheduleError, match=rf"big.csv: 2 stages x {m} microbatches = {2 * m} stage-microbatches"):
        schedules.from_csv(path)


def test_a_blank_row_between_ranks_is_refused_not_an_idle_rank(tmp_path):
    path = tmp_path / "gap.csv"
    path.write_text("0F0,0F1,0B0,0B1\n\n1F0,1B0,1F1,1B1\n")
    with pytest.raises(ScheduleError) as e:
        schedules.from_csv(path)
    assert str(e.value) == (
        f"schedule CSV {path}: row 1 holds no action: each row is one rank's actions (rank 1 here); remove the blank row"
    )


@pytest.mark.parametrize("cell", ["\uff100F0", "0F\u0663"])  # a full-width 0 and an Arabic-Indic 3
def test_digits_are_ascii_ones(tmp_path, cell):
    """int() reads other scripts' digits: ０F0 was read as 0F0, 0F٣ as 0F3."""
    path = tmp_path / "digits.csv"
    path.write_text(f"{cell},0B0\n")
    with pytest.raises(ScheduleError, match=r"rank 0 cell 0: cannot parse action"):
        schedules.from_csv(path)


def test_a_csv_is_named_by_its_suffix_in_any_case(tmp_path):
    assert schedules.is_csv("MINE.CSV") and schedules.is_csv("a/b.Csv") and not schedules.is_csv("mine.txt")
    with pytest.raises(ScheduleError, match=r"or a schedule CSV, a file whose name ends in \.csv$"):
        schedules.build("plans/best.txt", 2, 4)
    with pytest.raises(ScheduleError) as e:
        schedules.build("zz_top", 2, 4)
    assert ".csv" not in str(e.value)


def test_a_cell_padded_with_other_whitespace_still_reads(tmp_path):
    """A spreadsheet's no-break space around a cell is padding, as a space is (only the digits
    must be ASCII)."""
    path = tmp_path / "nbsp.csv"
    path.write_text("0F0\u00a0,\u00a00B0\n")
    assert [str(a) for a in schedules.from_csv(path).compute_only().actions[0]] == ["0F0", "0B0"]
