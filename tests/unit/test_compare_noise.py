"""`ppx compare`'s notes on what its table cannot order: runs of one config apart (the
machine's run-to-run noise) and runs of one model whose middle halves of steps overlap."""

import math

from ppx.report.compare import _middle_half
from ppx.report.compare_notes import noise_notes
from ppx.report.labels import UNREAD, timing_key

A = {
    "pipeline.schedule": "1f1b",
    "pipeline.stages": 2,
    "model.kind": "llama",
    "train.batch_size": 16,
    "run.dir": "a",
    "logging.wandb.mode": "offline",
}


def _row(label: str, step_ms: float, steps_ms: list[float]) -> dict:
    return {
        "name": f"/runs/{label}",
        "label": label,
        "step_ms": step_ms,
        "step_range": _middle_half([x / 1e3 for x in steps_ms]),
    }


def test_the_middle_half_is_the_quartiles_of_four_steps_or_more():
    assert _middle_half([0.010, 0.011, 0.012, 0.013, 0.014, 0.015, 0.016, 0.017]) == "11.75-15.25"
    assert _middle_half([0.012, 0.010, 0.011]) is None  # (two or three: their extremes, the first step's among them)
    assert _middle_half([0.010, None, math.nan, 0.011, 0.012, 0.013]) == "10.75-12.25"  # finite steps only
    assert _middle_half(()) is None


def test_runs_of_one_config_give_the_noise_and_overlaps_of_one_model_are_named():
    b = {**A, "run.dir": "b", "logging.wandb.mode": "disabled"}  # the same run, elsewhere, logged otherwise
    c = {**A, "pipeline.schedule": "zb_h1"}
    mlp = {**A, "model.kind": "mlp", "pipeline.schedule": "gpipe"}
    assert timing_key(A) == timing_key(b) != timing_key(c)
    rows = [
        _row("one", 18.0, [17, 18, 19, 20]),
        _row("two", 26.0, [25, 26, 27, 28]),
        _row("zb", 19.0, [18, 19, 20, 21]),
        _row("mlp", 18.5, [18, 18.5, 19, 19.5]),  # overlaps, but another model: no pair of its
    ]
    one, other = noise_notes(rows, [A, b, c, mlp])
    assert one.startswith("note: one and two ran one config, and their median steps differ by 44%")
    assert other.startswith("note: the middle halves of the steps of one and zb overlap") and "mlp" not in other


def test_runs_apart_and_runs_of_unread_configs_name_no_overlap():
    rows = [_row("one", 10.0, [9.9, 10, 10.1, 10.2]), _row("zb", 12.0, [11.9, 12, 12.1, 12.2])]
    (once,) = noise_notes(rows, [A, {**A, "pipeline.schedule": "zb_h1"}])
    assert once.startswith("note: each config ran once, so this table holds none of this machine's run-to-run noise")
    # another model each: nothing to rank, no note
    assert noise_notes(rows, [A, {**A, "model.kind": "mlp", "pipeline.schedule": "zb_h1"}]) == []
    # two runs whose config.yaml was not read: their summaries' few values cannot say they ran one config
    unread = {UNREAD: True, "pipeline.schedule": "1f1b"}
    assert timing_key(unread) is None
    assert noise_notes([_row("a", 10.0, []), _row("b", 13.0, [])], [unread, dict(unread)]) == []


def test_lists_in_notes_read_as_prose():
    from ppx.report.compare_notes import listed

    assert listed(["a"]) == "a" and listed(["a", "b"]) == "a and b" and listed(["a", "b", "c"]) == "a, b and c"
    assert listed(list("abcdef")) == "a, b, c, d and 2 more"
    assert listed(["a and b", "c and d"], "; ", last="; ") == "a and b; c and d"  # pairs stay apart
