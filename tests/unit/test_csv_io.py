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
    with pytest.raises(ScheduleError, match=r"rank 1 step 1 \(1F1\): 1F1 appears 2 times"):
        schedules.from_csv(path)
