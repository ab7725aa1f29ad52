"""`ppx plan --from-run`'s split by the run's own measured costs (ppx.plan.rebalance): each
stage's F + B + W shared among its units by their FLOPs, split again so the heaviest stage is
as light as any split's."""

from __future__ import annotations

import pytest

from helpers import REPO
from ppx import config
from ppx.plan.inputs import PlanInputs
from ppx.plan.rebalance import measured_split, rebalance_note, unit_times
from ppx.plan.unit_weights import UnitWeights

# a tiny GPT-2 split by FLOPs (8, 2: the embedding and 7 layers, then a layer and the head, which
# weighs 5.12 layers by FLOPs), as measured on a CPU: the first stage 13.5 ms, the last 8.3
FLOPS = (0.0,) + (1.0,) * 8 + (5.12,)


def inputs(**kw) -> PlanInputs:
    base = dict(fwd_s=(0.0050, 0.0030), bwd_s=(0.0085, 0.0053), wgrad_s=(0.0, 0.0), stages=2, run_units=(8, 2))
    return PlanInputs(**{**base, **kw})


def test_each_stages_time_goes_to_its_units_by_their_flops():
    times = unit_times(inputs(), FLOPS)
    assert times[0] == 0 and times[1:8] == pytest.approx([0.0135 / 7] * 7)
    assert times[8] == pytest.approx(0.0083 / 6.12) and times[9] == pytest.approx(0.0083 * 5.12 / 6.12)
    assert sum(times) == pytest.approx(0.0218)
    # the plan's own unit weights first; equal shares without either
    got = unit_times(inputs(unit_weights=UnitWeights((1.0,) * 10, (0.0,) * 10, (0.0,) * 10)), FLOPS)
    assert got[:8] == pytest.approx([0.0135 / 8] * 8) and got[8:] == pytest.approx([0.0083 / 2] * 2)


def test_the_split_that_evens_the_measured_stages_is_named():
    """7, 3: the embedding and 6 layers (11.6 ms), then a layer, the layer and the head (10.2
    ms), where the run's heaviest stage took 13.5."""
    counts, heaviest, ran = measured_split(inputs(), FLOPS)
    assert counts == (7, 3) and heaviest == pytest.approx(0.0135 * 6 / 7) and ran == pytest.approx(0.0135)


def test_the_note_names_the_split_as_the_run_gives_its_own():
    """llama-tiny with 8 blocks run 5, 5 (the embedding and 4 blocks 13.5 ms, 4 blocks and the
    head 8.3): 4, 6 evens it, as pipeline.layers_per_stage, measured beside the run; beside
    replicas as a run of its own; none for the known-cost model or a V schedule's run."""
    run = dict(run_units=(5, 5))
    cfg = config.load("llama_tiny_1f1b_2cpu", ["model.layers=8"])
    note = rebalance_note("runs/x", inputs(**run), cfg)
    assert "(each stage's F + B + W a microbatch, shared among its units by their FLOPs)" in note
    assert "pipeline.layers_per_stage=[4,6] evens its stages: the heaviest 11.67 ms against 13.50 ms" in note
    assert note.endswith("as it ran (5, 5 units); the candidates above split the units as the run's config does: "
                         "measure it beside the run (run.paired)")  # fmt: skip
    replicas = config.load("llama_tiny_1f1b_2cpu", ["model.layers=8", "parallel.data=2"])
    assert rebalance_note("runs/x", inputs(**run), replicas).endswith("(ppx compare)")
    known = config.load("1f1b_2cpu", ["model.kind=synthetic", "model.cost_per=layer", "model.layers=10"])
    assert rebalance_note("runs/x", inputs(**run), known) is None
    v = config.load("llama_tiny_1f1b_2cpu", ["model.layers=8", "pipeline.schedule=zbv"])
    assert rebalance_note("runs/x", inputs(fwd_s=(0.005, 0.003) * 2, bwd_s=(0.008, 0.005) * 2,
                                           wgrad_s=(0.0,) * 4, stages=4, run_units=(3, 2, 2, 3)), v) is None  # fmt: skip


def test_a_modules_split_is_named_by_its_split_points(monkeypatch):
    """A module run split at model.split_points: the note names the units where its stages
    would begin, and a run of its own (an entry cannot change a module run's split points)."""
    monkeypatch.chdir(REPO)  # examples.tiny_gpt imports from the checkout's root
    cfg = config.load("examples/tiny_gpt.yaml", ["model.split_points=[blocks.3]"])
    assert cfg.pipeline.layers_per_stage == [4, 2]
    note = rebalance_note("runs/x", inputs(fwd_s=(0.004, 0.001), bwd_s=(0.008, 0.002), run_units=(4, 2)), cfg)
    assert "model.split_points=[blocks.2] evens its stages" in note and note.endswith("(ppx compare)")


def test_no_note_where_the_run_is_even_already_or_there_are_no_units():
    assert measured_split(inputs(fwd_s=(0.005, 0.005), bwd_s=(0.008, 0.008), run_units=(5, 5))) is None
    assert measured_split(inputs(run_units=None), FLOPS) is None
    # 29, 31 is lighter than the run's 30, 30 by 0.1%: not worth a run of its own
    close = inputs(fwd_s=(0.0100, 0.0100), bwd_s=(0.0200, 0.0190), run_units=(30, 30))
    assert measured_split(close) is None
    assert measured_split(inputs(fwd_s=(0.0100, 0.0100), bwd_s=(0.0200, 0.0100), run_units=(30, 30)))[0] == (25, 35)


def test_the_split_named_begins_no_stage_after_a_unit_handing_on_integers():
    """Where unit 6 hands on integers (your module's bins), 7, 3 would begin a stage after it:
    the split named keeps units 6 and 7 together (6, 4 here), as the run's config would refuse
    the other; none where the glued units leave fewer groups than stages."""
    counts, heaviest, _ = measured_split(inputs(no_cut_after=(6,)), FLOPS)
    assert counts == (6, 4) and heaviest == pytest.approx(0.0083 + 0.0135 * 2 / 7), counts
    assert measured_split(inputs(no_cut_after=tuple(range(9))), FLOPS) is None
