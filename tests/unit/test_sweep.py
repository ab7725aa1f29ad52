"""Sweep points (ppx.launch.sweep)."""

from ppx.launch.sweep import point_name


def test_sweep_points_get_distinct_folders():
    assert point_name(["pipeline.schedule=a.csv", "train.lr=0.5"]) == "schedule=a.csv,lr=0.5"
    assert point_name(["train.lr=1.5"]) != point_name(["train.lr=0.5"])


def test_a_swept_path_names_its_folder_by_its_last_part_unless_two_share_it():
    from ppx.launch.sweep import parse_spec, point_names, points

    grid = points(parse_spec("pipeline.schedule=/tmp/a/mine.csv,1f1b train.lr=0.5"))
    assert point_names(grid) == ["schedule=mine.csv,lr=0.5", "schedule=1f1b,lr=0.5"]
    grid = points(parse_spec("pipeline.schedule=/tmp/a/mine.csv,/tmp/b/mine.csv"))
    assert point_names(grid) == ["schedule=_tmp_a_mine.csv", "schedule=_tmp_b_mine.csv"]


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


def test_a_repeated_sweep_runs_in_rounds_each_folder_naming_its_round():
    from ppx.launch.sweep import in_rounds, parse_spec, point_name, points

    grid = points(parse_spec("pipeline.schedule=1f1b,zb_h1"))
    names = [point_name(p) for p in grid]
    assert in_rounds(grid, names, 1) == [(grid[0], "schedule=1f1b", 1), (grid[1], "schedule=zb_h1", 1)]
    got = in_rounds(grid, names, 2)
    assert [name for _, name, _ in got] == [
        "schedule=1f1b,repeat=1",
        "schedule=zb_h1,repeat=1",
        "schedule=1f1b,repeat=2",
        "schedule=zb_h1,repeat=2",
    ]
    assert [r for _, _, r in got] == [1, 1, 2, 2] and [p for p, _, _ in got] == grid * 2
    assert [name for _, name, _ in in_rounds([[]], [""], 3)] == ["repeat=1", "repeat=2", "repeat=3"]


def test_an_empty_value_is_refused_not_dropped():
    import pytest

    from ppx.errors import UserError
    from ppx.launch.sweep import parse_spec

    for spec in ("pipeline.microbatches=,4", "pipeline.microbatches=2,4,", "pipeline.microbatches=2,,4"):
        with pytest.raises(UserError, match=r"has an empty value; list them as pipeline.microbatches=v1,v2,"):
            parse_spec(spec)
    assert parse_spec("pipeline.layers_per_stage=[3,1],[2,2]") == [("pipeline.layers_per_stage", ["[3,1]", "[2,2]"])]


def test_run_dir_null_is_taken_and_any_other_override_of_a_swept_key_refused():
    """run.dir=null (no folder of its own, as a plan's printed commands end) is what a sweep
    does; a run.dir, or a swept key given again, even as null, is refused before any run."""
    import pytest

    from ppx.errors import UserError
    from ppx.launch import sweep

    with pytest.raises(UserError, match="run.dir names one run"):
        sweep.run_sweep("1f1b_2cpu", "pipeline.microbatches=2,4", ["run.dir=/tmp/x"])
    with pytest.raises(UserError, match="pipeline.virtual_stages is swept and also given as an override"):
        sweep.run_sweep("1f1b_2cpu", "pipeline.virtual_stages=1,2", ["pipeline.virtual_stages=null"])
    with pytest.raises(UserError, match="two sweep points would share"):  # (past the run.dir check: taken)
        sweep.run_sweep("1f1b_2cpu", "pipeline.microbatches=2,2", ["run.dir=null"])
