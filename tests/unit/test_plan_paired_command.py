"""The plan's command that measures its best, the candidates close to it, 1F1B and the run it
read beside one another (ppx.plan.paired_command): one run.paired entry each, at the run's p
and m (the others named as left out), the run's own config the floor, checked as ppx run would
check it."""

from __future__ import annotations

import shlex

from ppx import config
from ppx.config.paired import floors
from ppx.plan.paired_command import entry_of, note, paired_command

EXP = "llama_tiny_1f1b_2cpu"  # p=2, m=4, 1F1B, 4 steps


def _c(label: str, p: int, m: int, *overrides: str) -> tuple:
    return (label, p, m, [*overrides, f"pipeline.stages={p}", f"pipeline.microbatches={m}", "run.dir=null"])


def test_a_candidates_overrides_become_an_entry_of_its_pipeline_model_and_train_keys():
    assert entry_of(["pipeline.schedule=zb_h2", "pipeline.stages=2", "train.split_backward=auto", "run.dir=null"]) == (
        "pipeline.schedule=zb_h2 train.split_backward=auto"
    )
    assert entry_of(["pipeline.schedule=/my plans/best.csv"]) is None  # an entry splits at spaces


def test_the_best_and_the_close_ones_at_the_runs_p_and_m_beside_the_run_as_its_floor():
    run = config.load(EXP, [])
    chosen = [
        _c("zb_h1 p=2 m=4", 2, 4, "pipeline.schedule=zb_h1"),
        _c("interleaved_1f1b p=2 m=4 v=2", 2, 4, "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"),
        _c("gpipe p=4 m=4", 4, 4, "pipeline.schedule=gpipe"),  # other processes: left out
        _c("gpipe p=2 m=8", 2, 8, "pipeline.schedule=gpipe", "train.batch_size=32"),  # another m: left out
    ]
    got = paired_command(chosen, run, EXP)
    assert got.command == (
        f"ppx sweep {EXP} --repeat 5 'run.paired=[pipeline.schedule=1f1b,pipeline.schedule=zb_h1,"
        '"pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2"]\' train.steps=40'  # 4 steps: too few
    )
    assert got.measured == ["zb_h1 p=2 m=4", "interleaved_1f1b p=2 m=4 v=2"] and got.own == []
    assert got.left == {"another p or m than the run's p=2 m=4": ["gpipe p=4 m=4", "gpipe p=2 m=8"]}
    assert note(got).endswith("; left out: gpipe p=4 m=4, gpipe p=2 m=8 (another p or m than the run's p=2 m=4)")
    # none at the run's p and m: no command, but what is left out, and how to compare them
    alone = paired_command(chosen[2:], run, EXP)
    assert alone.command == "" and note(alone).startswith("gpipe p=4 m=4, gpipe p=2 m=8 (another p or m")
    assert "compare as whole runs, repeated (ppx sweep --repeat)" in note(alone)
    words = shlex.split(got.command)  # as a shell reads it: the config it loads names the run as the floor
    cfg = config.load(words[2], [words[5], *words[6:]])
    assert floors(cfg) == ["pipeline.schedule=1f1b"] and cfg.train.steps == 40


def test_the_best_that_is_the_runs_own_config_is_the_floor_and_1f1b_stands_beside_it(tmp_path):
    """A ZB-V run left at its default v: the plan's best names v=2, the same run spelled
    otherwise, so it is the floor; 1F1B at the run's m stands beside it."""
    run = config.load(EXP, ["pipeline.schedule=zbv", "train.steps=40"])
    (tmp_path / "config.yaml").write_text(config.to_yaml(run))  # the run's config.yaml, as the plan reads it
    exp = str(tmp_path / "config.yaml")
    best = _c("zbv p=2 m=4 v=2", 2, m := 4, "pipeline.schedule=zbv", "pipeline.virtual_stages=2")
    ref = [_c("1f1b p=2 m=4", 2, m, "pipeline.schedule=1f1b"), _c("1f1b p=2 m=8", 2, 8, "pipeline.schedule=1f1b")]
    got = paired_command([best], run, exp, ref)
    assert got.own == ["zbv p=2 m=4 v=2"] and got.left == {}  # the reference at another m is not named as left out
    assert got.command.endswith(
        "'run.paired=[\"pipeline.schedule=zbv pipeline.virtual_stages=2\",pipeline.schedule=1f1b]'"
    )
    assert note(got).startswith("zbv p=2 m=4 v=2 (the run's own config), 1f1b p=2 m=4 beside the run's")
    assert paired_command([best], run, exp) is None  # the run alone: nothing to measure
    # an entry that cannot be one (a key fixed for the job) gives no command, not one that fails
    assert paired_command([_c("zb_h1", 2, 4, "pipeline.schedule=zb_h1", "train.steps=3")], run, exp) is None


def test_two_candidates_of_one_list_are_one_entry_the_other_named_as_left_out():
    """run.paired refuses two entries of one config: a candidate whose list is another's (ZB-V
    with its default v given; zb_auto's list is often 1F1B's) is named as left out, and the
    command stands (it was dropped, unsaid, when the plan's three best held both)."""
    run = config.load(EXP, [])
    chosen = [
        _c("zbv p=2 m=4 v=2", 2, 4, "pipeline.schedule=zbv"),
        _c("zb_h1 p=2 m=4", 2, 4, "pipeline.schedule=zb_h1"),
        _c("zbv' p=2 m=4 v=2", 2, 4, "pipeline.schedule=zbv", "pipeline.virtual_stages=2"),
    ]
    got = paired_command(chosen, run, EXP)
    assert got.command and got.measured == ["zbv p=2 m=4 v=2", "zb_h1 p=2 m=4"]
    assert got.left == {"the same list as zbv p=2 m=4 v=2": ["zbv' p=2 m=4 v=2"]}
    assert "pipeline.virtual_stages=2" not in got.command


def test_the_next_ranked_fill_the_command_to_its_least_lists_passing_over_twins():
    """Beside the best, the next ranked at the run's p and m until three lists are measured; one
    whose list is already there, or at another m, is passed over unsaid (it was never named)."""
    run = config.load(EXP, [])
    best = [_c("zbv p=2 m=4 v=2", 2, 4, "pipeline.schedule=zbv")]
    more = [
        _c("zbv' p=2 m=4 v=2", 2, 4, "pipeline.schedule=zbv", "pipeline.virtual_stages=2"),  # the best's list
        _c("gpipe p=2 m=8", 2, 8, "pipeline.schedule=gpipe", "train.batch_size=32"),  # another m
        _c("zb_h1 p=2 m=4", 2, 4, "pipeline.schedule=zb_h1"),
        _c("zb_h2 p=2 m=4", 2, 4, "pipeline.schedule=zb_h2"),
        _c("gpipe p=2 m=4", 2, 4, "pipeline.schedule=gpipe"),  # (three already)
    ]
    got = paired_command(best, run, EXP, more=more, least=3)
    assert got.measured[:3] == ["zbv p=2 m=4 v=2", "zb_h1 p=2 m=4", "zb_h2 p=2 m=4"] and got.left == {}
    assert "gpipe" not in got.command
    assert paired_command(best, run, EXP, more=more).measured == ["zbv p=2 m=4 v=2"]  # (least 0: the best alone)
