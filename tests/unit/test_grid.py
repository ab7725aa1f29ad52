"""The text grid of a schedule (ppx.schedules.grid)."""

from ppx import schedules
from ppx.schedules.grid import render_grid


def test_grid_shows_each_rank_and_idle():
    grid = render_grid(schedules.build("gpipe", 2, 2)).splitlines()
    assert grid[0].split() == ["time", "0", "1", "2", "3", "4", "5"]
    assert grid[1].split()[2:] == ["F0", "F1", ".", ".", "B0", "B1"]
    assert grid[2].split()[2:] == [".", "F0", "F1", "B0", "B1", "."]
