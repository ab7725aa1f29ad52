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
    assert verdict({"over_run_ci95": [0.98, 1.0]}).startswith("not told apart")
