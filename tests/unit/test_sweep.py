"""Sweep points (ppx.launch.sweep)."""

from ppx.launch.sweep import point_name


def test_sweep_points_get_distinct_folders():
    assert point_name(["pipeline.schedule=a.csv", "train.lr=0.5"]) == "schedule=a.csv,lr=0.5"
    assert point_name(["train.lr=1.5"]) != point_name(["train.lr=0.5"])


def test_a_sweep_across_schedules_compares_them_at_equal_work(tmp_path):
    from ppx.launch.sweep import equal_work, parse_spec

    schedules = parse_spec("pipeline.schedule=1f1b,interleaved_1f1b")
    assert equal_work("gpipe_2cpu", schedules, ["model.kind=synthetic"]) == "model.cost_per=layer"
    assert equal_work("gpipe_2cpu", parse_spec("pipeline.virtual_stages=2,4"), []) == "model.cost_per=layer"
    # the user's choice stands, on the command line, as an axis or in the experiment
    assert equal_work("gpipe_2cpu", schedules, ["model.cost_per=stage"]) is None
    assert equal_work("gpipe_2cpu", parse_spec("pipeline.schedule=1f1b,gpipe model.cost_per=stage,layer"), []) is None
    exp = tmp_path / "mine.yaml"
    exp.write_text("model:\n  kind: synthetic\n  cost_per: stage\n")
    assert equal_work(str(exp), schedules, []) is None
    # a sweep that keeps the placement compares nothing across placements
    assert equal_work("gpipe_2cpu", parse_spec("pipeline.microbatches=2,4"), []) is None
