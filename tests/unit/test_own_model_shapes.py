"""Your own model's units of different shapes and dtypes (model.kind=module): each stage
receives what the unit before it hands on, under either executor, and a stage that would begin
with integers is refused on the schedule's own stage count (ppx's checks before any work)."""

from __future__ import annotations

import pytest

from helpers import REPO
from ppx import config
from ppx.errors import UserError

SEQUENTIAL = ["1f1b_2cpu", "model.kind=module", "model.data=regression", "model.args={width: 16, depth: 4}"]


def test_a_stage_begins_with_floats_on_the_schedules_own_stage_count(monkeypatch, tmp_path):
    """The split checked is the schedule's: a CSV placing 4 stages on 2 ranks (its own count,
    pipeline.virtual_stages left null) cuts the quantized units 1, 1, 1, 1, one stage beginning
    after the integers (checked at pipeline.stages' 2, it passed, and the rank failed at its
    first forward); its layers_per_stage of 4 entries loads (it was refused: "2 stages"). A
    forward-only list sends no gradient back: integers may begin a stage there."""
    from ppx import schedules

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    csv = tmp_path / "looped.csv"
    schedules.write_csv(schedules.build("interleaved_1f1b", 2, 4, 2).compute_only(), csv)
    own = [*SEQUENTIAL[1:], "model.hidden=16", f"pipeline.schedule={csv}"]
    with pytest.raises(UserError, match=r"^model.kind=module: stage 1 would begin at unit 1, handed int64 "):
        config.load(SEQUENTIAL[0], [*own, "model.module=helpers.own_shapes:quantized"])
    widths = config.load(SEQUENTIAL[0], [*own, "model.module=helpers.own_shapes:widths", "model.layers=4"])
    assert widths.pipeline.schedule == str(csv)
    four = ["model.module=helpers.own_shapes:widths", "pipeline.layers_per_stage=[1,1,1,1]"]
    assert config.load(SEQUENTIAL[0], [*own, *four]).pipeline.layers_per_stage == [1, 1, 1, 1]
    quiet = ["model.module=helpers.own_shapes:quantized", "pipeline.schedule=forward_only", "pipeline.stages=4"]
    assert config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], "model.hidden=16", *quiet]).pipeline.stages == 4


@pytest.mark.parametrize("executor", ["ppx", "torch"])
def test_units_of_different_shapes_and_dtypes_load_under_either_executor(monkeypatch, executor):
    """Each stage receives what the unit before it hands on (ppx's executor had sent one shape,
    and refused units handing on two: "ppx sends one"); torch's finds each stage's itself."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    for builder in ("uneven", "double_middle"):  # (8, 32) then (8, 16); float32 then float64
        own = [f"model.module=helpers.own_module:{builder}", "model.layers=3", "model.hidden=16"]
        cfg = config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], *own, f"pipeline.executor={executor}"])
        assert cfg.pipeline.executor == executor
