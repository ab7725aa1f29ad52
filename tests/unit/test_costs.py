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


def _through_stages(cut: tuple, split: bool):
    """Blocks 0-3 of the known-cost model cut into stages of ``cut`` blocks, forward then
    backward stage by stage (each B, or I then W): (output, input gradient, weight gradients)."""
    import torch

    from ppx.models.action_clock import ActionClock

    clock = ActionClock()
    starts = [sum(cut[:k]) for k in range(len(cut))]
    stages = [synthetic.KnownCostStage(8, 0, 0, 0, 7, range(a, a + n), clock) for a, n in zip(starts, cut)]
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    ins, outs = [], []
    for stage in stages:
        ins.append((outs[-1] if outs else x).detach().requires_grad_())
        outs.append(stage(ins[-1]))
    g, weight_grads = torch.randn(3, 8, generator=torch.Generator().manual_seed(2)), []
    for stage, inp, out in zip(reversed(stages), reversed(ins), reversed(outs)):
        weights = list(stage.weights)
        if split:
            clock.part = "input"
            (g_in,) = torch.autograd.grad(out, [inp], g, retain_graph=True)
            clock.part = "weight"
            weight_grads = list(torch.autograd.grad(out, weights, g)) + weight_grads
        else:
            clock.part = "full"
            g_in, *got = torch.autograd.grad(out, [inp, *weights], g)
            weight_grads = got + weight_grads
        g = g_in
    return outs[-1], g, weight_grads


@pytest.mark.parametrize("cut", [(1, 3), (2, 2), (3, 1), (1, 1, 2), (1, 1, 1, 1)])
@pytest.mark.parametrize("split", [False, True])
def test_the_known_cost_blocks_give_the_same_floats_however_they_are_cut_into_stages(cut, split):
    """Block after block: a stage of several blocks multiplied their weights first, so zbv's
    and interleaved's losses differed from 1f1b's by 1e-7 (and [1,3]'s from [2,2]'s). The
    output, the input gradient and each block's weight gradient, whole (B) or split (I, then
    W), are the one-stage build's, bitwise."""
    import torch

    one = _through_stages((4,), False)
    got = _through_stages(cut, split)
    assert torch.equal(got[0], one[0]) and torch.equal(got[1], one[1])
    assert len(got[2]) == 4 and all(torch.equal(a, b) for a, b in zip(got[2], one[2]))
