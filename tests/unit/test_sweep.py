"""Sweep points (ppx.launch.sweep)."""

from ppx.launch.sweep import point_name


def test_sweep_points_get_distinct_folders():
    assert point_name(["pipeline.schedule=a.csv", "train.lr=0.5"]) == "schedule=a.csv,lr=0.5"
    assert point_name(["train.lr=1.5"]) != point_name(["train.lr=0.5"])
