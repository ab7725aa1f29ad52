"""run.paired's summary (ppx.measure.paired) from every rank's records of each step."""

from __future__ import annotations

import pytest

from ppx.measure.paired import paired_lines, paired_step, paired_summary


def test_a_paired_step_spans_every_rank_and_takes_the_last_stages_loss():
    records = [{"paired": [[1.0, 1.5, None], [2.0, 2.2, None]]}, {"paired": [[1.1, 1.8, 0.5], [2.05, 2.3, 0.7]]}]
    got = paired_step(records)
    assert got[0] == (pytest.approx(0.8), 0.5) and got[1] == (pytest.approx(0.3), 0.7)


def test_ratios_are_step_by_step_and_losses_compared_bitwise():
    run_times = [1.0, 2.0, 1.0, 1.0, 4.0]
    run_losses = [3.0, 2.0, 1.0, 0.5, 0.25]
    steps = [[(1.1, 3.0), (1.0, 3.0)], [(2.0, 2.0), (2.0, 2.0 + 1e-12)], [(1.2, 1.0), (1.0, 1.1)]]
    steps += [[(0.9, 0.5), (1.0, 0.5)], [(4.4, 0.25), (4.0, 0.25)]]
    out = paired_summary(["a", "b"], run_times, run_losses, steps)
    a, b = out["a"], out["b"]
    # a's ratios 1.1, 1.0, 1.2, 0.9, 1.1: their median, not the ratio of the medians (1.1 / 1.0)
    assert a["over_run"] == pytest.approx(1.1) and a["pairs"] == 5 and a["median_step_s"] == pytest.approx(1.2)
    assert a["over_run_q1_q3"] == pytest.approx([1.0, 1.1])
    assert a["losses_equal"] is True and "first_loss_difference_step" not in a
    assert b["losses_equal"] is False and b["first_loss_difference_step"] == 1
    assert b["max_loss_difference"] == pytest.approx(0.1)
    lines = paired_lines(out)
    assert lines[0].startswith("ppx: paired 'a': step 1.2000 s, 1.100x the run's step beside it (median of 5 pairs")
    assert "losses differ from step 1 (by up to 0.1)" in lines[1]


def test_fewer_than_four_pairs_give_no_middle_half():
    out = paired_summary(["a"], [1.0, 1.0], [None, None], [[(1.0, None)], [(1.2, None)]])
    assert "over_run_q1_q3" not in out["a"] and out["a"]["losses_equal"] is True
    assert "middle half" not in paired_lines(out)[0]


def test_the_medians_interval_is_the_binomial_order_statistics():
    """The textbook ranks (n=10: 2nd and 9th; n=20: 6th and 15th; n=40: 14th and 27th), none
    below 6 values; and about 95% of samples' intervals hold their median."""
    import random

    from ppx.measure.paired import median_interval

    for n, (lo, hi) in {6: (1, 6), 10: (2, 9), 20: (6, 15), 40: (14, 27), 100: (40, 61)}.items():
        assert median_interval([float(i) for i in range(1, n + 1)]) == (lo, hi)
    assert median_interval([1.0] * 5) is None
    rng = random.Random(0)
    held = 0
    for _ in range(2000):
        lo, hi = median_interval([rng.gauss(0, 1) for _ in range(25)])
        held += lo <= 0 <= hi
    assert 0.93 < held / 2000 < 0.99


def test_the_verdict_tells_apart_only_where_the_interval_leaves_one_out():
    run = [1.0] * 12
    steps = {
        "faster": [[(0.9 + 0.001 * i, None)] for i in range(12)],
        "slower": [[(1.05 + 0.001 * i, None)] for i in range(12)],
        "not told apart": [[(0.95 + 0.01 * i, None)] for i in range(12)],
    }
    for word, got in steps.items():
        line = paired_lines(paired_summary(["e"], run, [None] * 12, got))[0]
        assert f": {word} (95% interval of the median " in line, line


def test_commands_a_plan_prints_from_a_paired_run_leave_its_entries_out():
    """A plan's candidate and its measuring run are what was planned, not the run's comparison:
    their commands on the run's config.yaml say run.paired=[] (and only from a paired run)."""
    from ppx import config
    from ppx.plan.calibrate import split_calibration
    from ppx.plan.evaluate import Result
    from ppx.plan.howto import check, command, from_run_overrides
    from ppx.plan.inputs import PlanInputs

    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.0), wgrad_s=(0.5, 0.5), stages=2)
    best = Result("1f1b", 2, 8, 2, 1.0, 0.0, (0.0, 0.0), True)  # v=2: no entry's 1f1b can run beside it
    paired = config.load("1f1b_2cpu", ["run.paired=[pipeline.schedule=gpipe]"])
    extra = from_run_overrides(best, paired, inputs)
    assert "run.paired=[]" in extra
    assert "run.paired=[]" not in from_run_overrides(best, config.load("1f1b_2cpu", []), inputs)
    text = command(best, "interleaved_1f1b", "1f1b_2cpu 'run.paired=[pipeline.schedule=gpipe]'", tuple(extra))
    assert "run.paired=[]" in text
    assert split_calibration("r/config.yaml", "store", paired=True).endswith("run.paired=[] run.dir=null")
    assert "run.paired" not in split_calibration("r/config.yaml", "store")
    assert check("ppx run 1f1b_2cpu run.paired=[pipeline.schedule=gpipe] pipeline.virtual_stages=2") is not None


def test_one_entry_may_go_without_brackets():
    from ppx import config

    cfg = config.load("1f1b_2cpu", ["run.paired=pipeline.schedule=zb_h1 train.split_backward=drain"])
    assert cfg.run.paired == ["pipeline.schedule=zb_h1 train.split_backward=drain"]
    assert config.load("1f1b_2cpu", ["run.paired=[]"]).run.paired == []


def test_an_interval_that_leaves_one_out_never_reads_as_touching_it():
    from ppx.measure.paired import verdict

    assert verdict({"over_run_ci95": [0.946, 0.99973]}) == "faster (95% interval of the median 0.9460-0.9997)"
    assert verdict({"over_run_ci95": [0.95, 0.99]}) == "faster (95% interval of the median 0.950-0.990)"
    # as many digits as it takes for an end under 1 not to read as 1
    assert verdict({"over_run_ci95": [0.9512, 0.99996]}) == "faster (95% interval of the median 0.95120-0.99996)"
    assert verdict({"over_run_ci95": [0.98, 1.0]}) == "not told apart (95% interval of the median 0.980-1.000)"
    assert verdict({"over_run_ci95": [0.68165, 1.00004]}) == "not told apart (95% interval of the median 0.682-1.000)"
    assert verdict({"over_run_ci95": [0.98, 1.0]}).startswith("not told apart")


def test_entries_that_are_the_runs_own_config_are_floors():
    """An entry that sets only values the run has is a floor, whatever its spelling; one value
    apart is not; two floors in one run are refused (one config, twice)."""
    from ppx import config
    from ppx.config.paired import floors
    from ppx.errors import UserError

    for floor in ("pipeline.schedule=1f1b", '"train.lr=0.003 pipeline.microbatches=4"', "train.lr=3e-3"):
        cfg = config.load("llama_tiny_1f1b_2cpu", [f"run.paired=[{floor},pipeline.schedule=zb_h1,train.lr=0.01]"])
        assert (cfg.train.lr, cfg.pipeline.microbatches) == (0.003, 4)
        assert floors(cfg) == [floor.strip('"')]
    with pytest.raises(UserError, match="is the same config as 'pipeline.schedule=1f1b'"):
        config.load("llama_tiny_1f1b_2cpu", ["run.paired=[pipeline.schedule=1f1b,train.lr=3e-3]"])


def test_the_runs_own_list_spelled_otherwise_is_a_floor_too(tmp_path):
    """A family's default v given (ZB-V's 2), and a drained list given as its CSV beside a run that
    drains: the same lists on the same ranks, so the run's own config; an undrained list beside
    a drain run is not."""
    from ppx import config
    from ppx.config.paired import floors
    from ppx.config.resolve import resolve_schedule
    from ppx.schedules import csv_io

    zbv = config.load(
        "llama_tiny_1f1b_2cpu",
        ["pipeline.schedule=zbv", 'run.paired=["pipeline.schedule=zbv pipeline.virtual_stages=2"]'],
    )
    assert floors(zbv) == ["pipeline.schedule=zbv pipeline.virtual_stages=2"]
    drain = ["pipeline.schedule=zb_h1", "train.split_backward=drain"]
    path = tmp_path / "drained.csv"
    csv_io.write_csv(resolve_schedule(config.load("llama_tiny_1f1b_2cpu", drain)), path)
    entries = f'run.paired=["pipeline.schedule={path} train.split_backward=auto","pipeline.schedule=zb_h1 train.split_backward=auto"]'
    assert floors(config.load("llama_tiny_1f1b_2cpu", [*drain, entries])) == [
        f"pipeline.schedule={path} train.split_backward=auto"
    ]


def test_every_other_entry_is_held_against_the_first_floor_step_by_step():
    run = [1.0] * 8
    # per step: (entry a, the floor f, entry b); a is 1.05x the run and 1.05x the floor, b 1.02x the
    # run but the floor runs 1.04x the run in every step, so b is faster than the floor
    steps = [[(1.05 + 0.001 * i, None), (1.04, None), (1.02 + 0.001 * i, None)] for i in range(8)]
    out = paired_summary(["a", "f", "b"], run, [None] * 8, steps, floors=["f"])
    assert out["f"]["floor"] is True and "over_floor" not in out["f"]
    a, b = out["a"], out["b"]
    assert a["floor_entry"] == b["floor_entry"] == "f"
    assert a["over_floor"] == pytest.approx(1.0535 / 1.04) and a["over_floor_ci95"][0] > 1
    assert b["over_run_ci95"][0] > 1 and b["over_floor_ci95"][1] < 1
    lines = paired_lines(out)
    assert lines[1].startswith("ppx: paired 'f' (the run's own config: the floor): step 1.0400 s, 1.040x")
    assert ": slower (95% interval of the median 1.0" in lines[2]
    assert "; 0.984x the floor's ('f'): faster (95% interval of the median 0.981-0.987)" in lines[2]
    none = paired_summary(["a", "b"], run, [None] * 8, [s[::2] for s in steps])
    assert not any("floor" in k for row in none.values() for k in row)


def test_the_report_tables_floor_column():
    from ppx.measure.paired import PAIRED_HEADER, paired_rows

    steps = [[(1.05, None), (1.0, None)] for _ in range(8)]
    rows = paired_rows(paired_summary(["a", "f"], [1.0] * 8, [None] * 8, steps, floors=["f"]))
    col = PAIRED_HEADER.index("over the floor's")
    assert rows[0][col].startswith("1.050x: slower") and rows[1][col] == "(the floor: the run's own config)"


def test_a_floor_off_one_is_the_jobs_bias_not_a_verdict():
    """The run's own config beside it, 1.04x in every step: not "slower" than itself, but a bias
    of this job, which the other entries are held against."""
    from ppx.measure.paired import said

    steps = [[(1.04 + 0.001 * i, None), (1.03 + 0.001 * i, None)] for i in range(8)]
    out = paired_summary(["f", "a"], [1.0] * 8, [None] * 8, steps, floors=["f"])
    assert said(out["f"]) == "off 1, a bias of this job" and said(out["a"]) == "slower"
    line = paired_lines(out)[0]
    assert "(the run's own config: the floor)" in line and ": off 1, a bias of this job (95% interval" in line
    assert said(out["a"], "floor") == "faster"


def test_each_entry_says_the_split_it_ran():
    """llama-tiny at 4 stages splits 2, 1, 1, 2 by FLOPs; an entry splitting evenly ran 2, 2, 1, 1,
    one giving its own layers per stage those, one of another schedule the run's split."""
    from ppx import config
    from ppx.config.paired import entry_units

    listed = '[pipeline.balance=units,"pipeline.layers_per_stage=[1,1,1,3]",pipeline.schedule=zb_h1]'
    cfg = config.load("llama_tiny_1f1b_2cpu", ["pipeline.stages=4", f"run.paired={listed}"])
    got = {e: entry_units(cfg, e) for e in cfg.run.paired}
    assert got == {
        "pipeline.balance=units": [2, 2, 1, 1],
        "pipeline.layers_per_stage=[1,1,1,3]": [1, 1, 1, 3],
        "pipeline.schedule=zb_h1": [2, 1, 1, 2],
    }


def test_an_entrys_fp16_skipped_steps_are_counted_once_a_step_and_said():
    """Under fp16 each rank's kept record says whether the entry's optimizer stepped; a step
    skipped on an overflow (on every rank together) counts once; its line and the report's row
    say how many, and where it kept no such flag (fp32) nothing is said."""
    from ppx.measure.paired import add_kept, entry_skipped, kept_fields, paired_rows

    def step(stepped: list[bool | None]) -> list[dict]:  # one entry, a rank per flag
        return [{"paired": [[0.0, 1.0, None, {} if s is None else {"optimizer_stepped": s}]]} for s in stepped]

    kept: list[dict] = []
    for flags in ([True, True], [False, False], [True, True], [False, False]):
        add_kept(step(flags), kept)
    assert entry_skipped(step([False, False]), 0) is True and entry_skipped(step([None, None]), 0) is None
    row = {**paired_summary(["e"], [1.0] * 4, [1.0] * 4, [[(1.0, 1.0)]] * 4)["e"], **kept_fields(kept[0])}
    assert row["optimizer_steps_skipped"] == 2
    assert paired_lines({"e": row})[0].endswith(
        "losses equal at every step; 2 optimizer steps skipped on an fp16 overflow"
    )
    assert paired_rows({"e": row})[0][-1] == "equal (2 optimizer steps skipped on an fp16 overflow)"
    fp32: list[dict] = []
    add_kept(step([None, None]), fp32)
    assert "optimizer_steps_skipped" not in kept_fields(fp32[0])
    assert "skipped" not in paired_lines({"e": {**row, "optimizer_steps_skipped": 0}})[0]


def test_losses_that_differ_beside_a_list_summing_out_of_order_say_which_list():
    """``sums_out_of_order`` (the run's, the entry's or both lists): the line and report.html's
    row name it where the losses differ, and say nothing of it where they are equal."""
    from ppx.measure.paired import paired_rows

    out = paired_summary(
        ["a", "b"], [1.0, 1.0], [3.0, 2.0], [[(1.0, 3.0), (1.0, 3.0)], [(1.0, 2.0 + 1e-7), (1.0, 2.0)]]
    )
    out["a"]["sums_out_of_order"] = ["entry"]
    out["b"]["sums_out_of_order"] = ["run", "entry"]
    lines = paired_lines(out)
    said = "its list sums the microbatches out of microbatch order: rounding, not a wrong gradient"
    assert lines[0].endswith(f"losses differ from step 1 (by up to {1e-7:.3g}): {said}"), lines[0]
    assert lines[1].endswith("; losses equal at every step"), lines[1]
    assert paired_rows({"a": out["a"]})[0][-1] == f"differ from step 1; {said}"
    out["b"].update(losses_equal=False, first_loss_difference_step=0, max_loss_difference=1e-7)
    assert "both lists sum the microbatches out of microbatch order" in paired_lines(out)[1]
    out["b"]["sums_out_of_order"] = ["run"]
    assert "the run's list sums the microbatches" in paired_lines(out)[1]
