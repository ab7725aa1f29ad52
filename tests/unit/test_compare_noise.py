"""`ppx compare`'s notes on what its table cannot order: runs of one config apart (the
machine's run-to-run noise) and runs whose middle halves of steps overlap."""

from ppx.report.compare import _middle_half, noise_note
from ppx.report.labels import timing_key

A = {"pipeline.schedule": "1f1b", "pipeline.microbatches": 4, "run.dir": "a", "logging.wandb.mode": "offline"}


def _row(label: str, step_ms: float, steps_ms: list[float]) -> dict:
    return {"name": label, "label": label, "step_ms": step_ms, "step_range": _middle_half([x / 1e3 for x in steps_ms])}


def test_the_middle_half_is_the_quartiles_or_the_range_of_few_steps():
    assert _middle_half([0.010, 0.011, 0.012, 0.013, 0.014, 0.015, 0.016, 0.017]) == "11.25-15.75"
    assert _middle_half([0.012, 0.010, 0.011]) == "10.00-12.00"
    assert _middle_half(()) is None


def test_runs_of_one_config_give_the_noise_and_overlaps_are_named():
    b = {**A, "run.dir": "b", "logging.wandb.mode": "disabled"}  # the same run, elsewhere, logged otherwise
    c = {**A, "pipeline.schedule": "zb_h1"}
    assert timing_key(A) == timing_key(b) != timing_key(c)
    rows = [_row("one", 18.0, [17, 18, 19, 20]), _row("two", 26.0, [25, 26, 27, 28]), _row("zb", 19.0, [18, 19, 20])]
    note = noise_note(rows, [A, b, c])
    assert "note: one and two ran one config, and their median steps differ by 44%" in note
    assert "note: the middle halves of the steps of one and zb overlap" in note and "two and zb" not in note


def test_runs_apart_and_of_other_configs_say_nothing():
    rows = [_row("one", 10.0, [9.9, 10, 10.1, 10.2]), _row("zb", 12.0, [11.9, 12, 12.1, 12.2])]
    assert noise_note(rows, [A, {**A, "pipeline.schedule": "zb_h1"}]) is None
