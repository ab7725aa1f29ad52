"""`ppx schedule`: a schedule exported to CSV reads back as built."""

from __future__ import annotations

from helpers import ppx
from ppx import schedules


def test_exported_interleaved_csv_runs_as_built(tmp_path):
    """Interleaved batches sends with computes (groups); its CSV keeps the comms so that
    reading it back gives the same, deadlock-free list."""
    path = tmp_path / "il.csv"
    r = ppx("schedule", "interleaved_1f1b", "-p", "3", "-m", "6", "--csv", str(path))
    assert r.returncode == 0 and "with its SEND/RECV actions" in r.stdout, r.stderr
    assert schedules.from_csv(path).actions == schedules.build("interleaved_1f1b", 3, 6, 2).actions
