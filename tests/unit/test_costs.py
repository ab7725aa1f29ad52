"""The known-cost model's per-stage costs (ppx.models.costs, ppx.models.synthetic): per stage,
or per layer with a stage costing the sum over its layers, so that every placement does the
same work."""

from __future__ import annotations

import pytest

from ppx import config
from ppx.errors import UserError
from ppx.models import synthetic
from ppx.models.costs import stage_costs_ms
from ppx.models.split import split_layers


def cfg(*overrides):
    return config.load(None, ["model.kind=synthetic", *overrides])


def test_per_stage_costs_do_not_depend_on_the_layers():
    c = cfg("pipeline.stages=2", "model.layers=6", "model.fwd_ms=10", "model.bwd_ms=20", "model.wgrad_ms=5")
    assert c.model.cost_per == "stage"
    assert stage_costs_ms(c.model, 2) == ([10.0, 10.0], [20.0, 20.0], [5.0, 5.0])
    # v stages per rank: each stage costs the same again, so the step does v times the work
    assert stage_costs_ms(c.model, 4) == ([10.0] * 4, [20.0] * 4, [5.0] * 4)


@pytest.mark.parametrize(("p", "v"), [(2, 1), (2, 2), (4, 1), (4, 2), (3, 1)])
def test_per_layer_costs_sum_the_stages_layers(p, v):
    layers = 8
    c = cfg(
        f"pipeline.stages={p}", f"model.layers={layers}", "model.cost_per=layer", "model.fwd_ms=2", "model.bwd_ms=3"
    )
    fwd, bwd, wgrad = stage_costs_ms(c.model, p * v)
    counts = [len(r) for r in split_layers(layers, p * v)]  # p=3: 3, 3, 2
    assert fwd == [2.0 * n for n in counts] and bwd == [3.0 * n for n in counts] and wgrad == [0.0] * (p * v)
    # the total work is the model's, whatever p and v
    assert sum(fwd) == layers * 2.0 and sum(bwd) == layers * 3.0


def test_per_layer_costs_follow_an_uneven_split_and_a_list_per_layer():
    c = cfg(
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.stages=2",
        "pipeline.virtual_stages=2",
        "model.layers=6",
        "pipeline.layers_per_stage=[3,1,1,1]",
        "model.cost_per=layer",
        "model.fwd_ms=[1,2,3,4,5,6]",
        "model.bwd_ms=2",
        "model.wgrad_ms=[0,0,0,0,0,10]",
    )
    fwd, bwd, wgrad = stage_costs_ms(c.model, 4, c.pipeline.layers_per_stage)
    assert fwd == [6.0, 4.0, 5.0, 6.0] and bwd == [6.0, 2.0, 2.0, 2.0] and wgrad == [0.0, 0.0, 0.0, 10.0]
    # what each stage module charges: the same sums, from the blocks it holds
    ranges = split_layers(6, 4, [3, 1, 1, 1])
    assert [synthetic.stage_cost_ms(c.model, s, 4, ranges[s]) for s in range(4)] == list(zip(fwd, bwd, wgrad))
    # the whole model in one module (the single-process reference) costs all the layers
    assert synthetic.stage_cost_ms(c.model, 0, 1, range(6)) == (21.0, 12.0, 10.0)


def test_per_stage_module_costs_as_before():
    c = cfg("pipeline.stages=2", "model.fwd_ms=[5,10]", "model.bwd_ms=4")
    assert synthetic.stage_cost_ms(c.model, 1, 2, range(2, 4)) == (10.0, 4.0, 0.0)
    assert synthetic.stage_cost_ms(c.model, 0, 1, range(4)) == (15.0, 4.0, 0.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.cost_per=block"], "model.cost_per: Invalid value 'block'"),
        (
            ["model.cost_per=layer", "model.layers=4", "model.fwd_ms=[1,2]"],
            "model.fwd_ms must be one number or 4 numbers (one per layer, model.cost_per=layer), got [1, 2]",
        ),
        (
            ["pipeline.stages=2", "model.layers=4", "model.fwd_ms=[1,2,3,4]"],
            "model.fwd_ms must be one number or 2 numbers (one per stage), got [1, 2, 3, 4]",
        ),
        (["model.cost_per=layer", "model.bwd_ms=-1"], "model.bwd_ms must not be negative"),
    ],
)
def test_bad_costs_are_one_line_errors(overrides, message):
    with pytest.raises(UserError) as e:
        cfg(*overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
