"""What a run keeps of its run.paired entries' own measurements (`ppx.measure.paired.add_kept`,
`kept_fields`), and what a plan says of the candidates the run measured beside it
(`ppx.plan.beside.beside_note`)."""

from __future__ import annotations

import pytest

from ppx import config
from ppx.measure.paired import add_kept, kept_fields
from ppx.plan.evaluate import Result


def _record(rank: int, kept) -> dict:
    """One rank's step record with two entries: the first kept ``kept``, the second (as an
    older ppx wrote it) three fields."""
    return {"rank": rank, "paired": [[0.0, 1.0, None, kept], [0.0, 1.0, None]]}


def test_what_entries_kept_is_merged_over_ranks_and_steps():
    kept: list[dict] = []
    first = {
        "action_s": {"0F": [1.0, 2.0], "0I": [3.0]},
        "split_backward": {"0": {"mode": "whole"}},
        "saved_bytes_per_microbatch": {"0": 100},
        "held_after_input_bytes": {"0": 0},
    }
    second = {
        "action_s": {"1I": [4.0], "1W": [5.0]},
        "saved_bytes_per_microbatch": {"1": 200},
        "held_after_input_bytes": {"1": 50},
    }
    add_kept([_record(0, first), _record(1, second)], kept)
    add_kept([_record(0, {"action_s": {"0F": [6.0]}, "saved_bytes_per_microbatch": {"0": 80}}), _record(1, None)], kept)
    assert kept[0]["action_s"] == {"0F": [1.0, 2.0, 6.0], "0I": [3.0], "1I": [4.0], "1W": [5.0]}
    assert kept[0]["saved_bytes_per_microbatch"] == {"0": 100, "1": 200}  # the most any step counted
    assert kept[1] == {}  # (an entry that kept nothing)
    fields = kept_fields(kept[0])
    assert fields["cost_samples"]["action_s"]["0F"] == [1.0, 2.0, 6.0]
    assert fields["split_backward"] == {"0": {"mode": "whole"}}
    assert fields["input_freed_share"] == [pytest.approx(1.0), pytest.approx(0.75)]  # 1 - held / saved
    assert kept_fields(kept[1]) == {}


PAIRED = "run.paired=[pipeline.schedule=1f1b,pipeline.schedule=zb_h1]"


def _candidate(schedule: str, step: float, m: int = 4) -> tuple[Result, list[str]]:
    keys = [f"pipeline.schedule={schedule}", "pipeline.stages=2", f"pipeline.microbatches={m}", "run.dir=null"]
    return Result(schedule, 2, m, 1, step, 0.0, (0.0, 0.0), True), keys


def test_the_plan_holds_what_its_run_measured_beside_it_against_its_prediction():
    """A 1F1B run beside itself (its floor, left out) and ZB-H1: ZB-H1's measured ratio over the
    run's step stands next to the plan's predicted one; a candidate whose command does not load
    is passed over; without the run's own config among the candidates there is no ratio to give."""
    from ppx.plan.beside import beside_note

    run = config.load("transformer_1f1b_2cpu", [PAIRED])
    rows = {
        "pipeline.schedule=1f1b": {"over_run": 1.01, "floor": True},
        "pipeline.schedule=zb_h1": {"over_run": 1.05, "over_run_ci95": [1.0, 1.1]},
    }
    own, zb, gpipe = _candidate("1f1b", 0.100), _candidate("zb_h1", 0.098), _candidate("gpipe", 0.120)
    broken = (gpipe[0], [*gpipe[1], "pipeline.no_such_key=1"])
    got = beside_note("runs/x", *zip(*[own, zb, broken]), run, "transformer_1f1b_2cpu", rows)
    assert got == (
        "note: runs/x ran candidates beside its own config (1f1b), step by step; each one's step over the run's "
        "beside it: zb_h1 ('pipeline.schedule=zb_h1') measured 1.050x (95% interval of the median 1.000-1.100), "
        "predicted 0.980x"
    )
    assert beside_note("runs/x", *zip(*[zb, gpipe]), run, "transformer_1f1b_2cpu", rows) is None
    other_m = _candidate("zb_h1", 0.098, m=8)  # (an entry shares the run's m)
    assert beside_note("runs/x", *zip(*[own, other_m]), run, "transformer_1f1b_2cpu", rows) is None


def test_a_drained_list_matches_its_csv_however_each_places_its_sends(tmp_path):
    """ZB-H2 drained as train.split_backward=drain makes it and as a CSV of the same compute
    order are the same work (`same_work`), and the same run: the drained list's sends are
    placed for its own order, as the CSV's reader places them (they sat apart, where the built
    list's placement was kept)."""
    from ppx import schedules
    from ppx.config.paired import same_run, same_work
    from ppx.schedules.ir.structure import drain_only

    csv = tmp_path / "zb_h2_drain.csv"
    schedules.write_csv(drain_only(schedules.build("zb_h2", 2, 8)).compute_only(), csv)
    base = ["pipeline.stages=2", "pipeline.microbatches=8", "model.layers=8"]
    drained = config.load("llama_tiny_1f1b_2cpu", [*base, "pipeline.schedule=zb_h2", "train.split_backward=drain"])
    listed = config.load("llama_tiny_1f1b_2cpu", [*base, f"pipeline.schedule={csv}"])
    assert same_work(drained, listed)
    assert not same_work(drained, config.load("llama_tiny_1f1b_2cpu", [*base, "pipeline.schedule=zb_h2"]))
    assert same_run(drained, listed)
