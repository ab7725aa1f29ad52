"""`ppx.schedules.ir.sum_order`: every family's list sums its microbatches in microbatch order
(weight gradients at B or W, the small weights' at a storing I, the loss at the last stage's
F); a CSV need not, and `ppx run` says so of the lists it runs."""

from __future__ import annotations

import pytest

from ppx import config, schedules
from ppx.schedules.ir.sum_order import out_of_order, out_of_order_note

RANK0 = "0F0,0F1,0F2,0B0,0B1,0B2\n"


def test_every_familys_list_and_zb_autos_sum_in_microbatch_order():
    from ppx.schedules.auto.auto_zb import auto_zb
    from ppx.schedules.ir.structure import drain_only
    from ppx.schedules.sim.costs import Costs

    for name, fam in schedules.FAMILIES.items():
        v = 2 if fam.virtual or fam.default_virtual == 2 else 1
        for p, m in ((2, 4), (4, 8)):
            built = schedules.build(name, p, m, v)
            assert out_of_order(built) is None and out_of_order(drain_only(built)) is None, name
    for costs in (Costs(fwd=1, bwd=1, wgrad=1), Costs(fwd=[1, 2, 1], bwd=[2, 1, 1], wgrad=[0.5, 2, 1])):
        for limit in (None, 6):  # (W's filling idle time, held back on later ranks)
            assert out_of_order(auto_zb(3, 6, costs, mem_limit=limit)) is None, (costs, limit)


@pytest.mark.parametrize(
    "rank1, want",
    [
        ("1F0,1B0,1F1,1I1,1F2,1B2,1W1", ("weights", 1, 1, 2)),  # W1 after B2
        ("1F0,1F1,1F2,1I0,1I2,1I1,1W0,1W1,1W2", ("inputs", 1, 1, 2)),  # the W's in order, the I's not
        (
            "1F0,1F1,1F2,1I0,1I1,1B2,1W0,1W1",
            ("weights", 1, 1, 2),
        ),  # (2 + 0) + 1: the first two either way, not the third
        ("1F0,1F2,1F1,1B0,1B1,1B2", ("loss", 1, 1, 2)),  # the last stage's forwards: the loss's sum
        ("1F1,1F0,1F2,1B1,1B0,1B2", None),  # the first two terms either way: x + y is y + x
        ("1F0,1I0,1F1,1I1,1F2,1I2,1W0,1W1,1W2", None),
    ],
)
def test_a_csv_that_sums_a_microbatch_after_a_later_one_is_found(tmp_path, rank1, want):
    path = tmp_path / "mine.csv"
    path.write_text(RANK0 + rank1 + "\n")
    assert out_of_order(schedules.from_csv(path)) == want


def test_a_first_stage_may_run_its_forwards_in_any_order(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("0F0,0F2,0F1,0B0,0B1,0B2\n1F0,1F1,1F2,1B0,1B1,1B2\n")
    assert out_of_order(schedules.from_csv(path)) is None  # (only the last stage's forwards add a loss)


def test_the_run_notes_an_is_order_only_where_its_is_add_gradients(tmp_path):
    """An I adds gradients only under a split that stores (its small weights'): under the
    graph's way, or torch's runtime, I's out of order change no sum, and `ppx run` says nothing;
    a run.paired entry's note names the entry."""
    from ppx.commands.run import _entries, _notes
    from ppx.config import resolve_schedule

    def notes(cfg):
        return _notes(cfg, resolve_schedule(cfg), _entries(cfg))

    path = tmp_path / "mine.csv"
    path.write_text(RANK0 + "1F0,1F1,1F2,1I0,1I2,1I1,1W0,1W1,1W2\n")
    base = ["model.kind=mlp", "pipeline.stages=2", "pipeline.microbatches=3", "train.batch_size=6"]
    note = out_of_order_note(schedules.from_csv(path))
    assert note.startswith("runs stage 1's I of microbatch 1 after microbatch 2's, where a split backward that stores")
    assert notes(config.load(None, [*base, f"pipeline.schedule={path}"])) == [f"ppx: note: {path} {note}"]
    for way in ("train.split_backward=graph", "pipeline.executor=torch"):
        assert notes(config.load(None, [*base, f"pipeline.schedule={path}", way])) == [], way
    entry = f"pipeline.schedule={path}"
    got = notes(config.load(None, [*base, "pipeline.schedule=1f1b", f"run.paired=['{entry}']"]))
    assert got == [f"ppx: note: run.paired '{entry}': {path} {note}"]


def test_the_summary_of_a_run_whose_csv_went_away_says_nothing_of_its_order(tmp_path):
    """The summary reads the CSVs again at the run's end: one removed meanwhile is not a failed run."""
    from ppx.config.resolve import sum_order_note
    from ppx.report.run_report import _said_of_order

    path = tmp_path / "mine.csv"
    path.write_text(RANK0 + "1F0,1F1,1F2,1I0,1I2,1I1,1W0,1W1,1W2\n")
    base = ["model.kind=mlp", "pipeline.stages=2", "pipeline.microbatches=3", "train.batch_size=6"]
    cfg = config.load(None, [*base, f"pipeline.schedule={path}"])
    assert _said_of_order(sum_order_note, cfg).startswith("runs stage 1's I of microbatch 1")
    path.unlink()
    assert _said_of_order(sum_order_note, cfg) is None
