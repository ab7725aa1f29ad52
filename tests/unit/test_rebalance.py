"""`ppx plan --from-run`'s split by the run's own measured costs (ppx.plan.rebalance): each
stage's F + B + W shared among its units by their FLOPs, split again so the heaviest stage is
as light as any split's."""

from __future__ import annotations

import pytest

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
    times = unit_times(inputs(split_weights=FLOPS))
    assert times[0] == 0 and times[1:8] == pytest.approx([0.0135 / 7] * 7)
    assert times[8] == pytest.approx(0.0083 / 6.12) and times[9] == pytest.approx(0.0083 * 5.12 / 6.12)
    assert sum(times) == pytest.approx(0.0218)
    # the plan's own unit weights first; equal shares without either
    got = unit_times(inputs(split_weights=FLOPS, unit_weights=UnitWeights((1.0,) * 10, (0.0,) * 10, (0.0,) * 10)))
    assert got[:8] == pytest.approx([0.0135 / 8] * 8) and got[8:] == pytest.approx([0.0083 / 2] * 2)


def test_the_split_that_evens_the_measured_stages_is_named():
    """7, 3: the embedding and 6 layers (11.6 ms), then a layer, the layer and the head (10.2
    ms), where the run's heaviest stage took 13.5."""
    counts, heaviest, ran = measured_split(inputs(split_weights=FLOPS))
    assert counts == (7, 3) and heaviest == pytest.approx(0.0135 * 6 / 7) and ran == pytest.approx(0.0135)
    note = rebalance_note("runs/x", inputs(split_weights=FLOPS))
    assert "pipeline.layers_per_stage=[7,3] evens its stages: the heaviest 11.57 ms against 13.50 ms" in note
    assert "as it ran (8, 2 units)" in note


def test_no_note_where_the_run_is_even_already_or_there_are_no_units():
    assert measured_split(inputs(fwd_s=(0.005, 0.005), bwd_s=(0.008, 0.008), run_units=(5, 5))) is None
    assert measured_split(inputs(run_units=None)) is None
    # 29, 31 is lighter than the run's 30, 30 by 0.1%: not worth a run of its own
    close = inputs(fwd_s=(0.0100, 0.0100), bwd_s=(0.0200, 0.0190), run_units=(30, 30))
    assert measured_split(close) is None
    assert measured_split(inputs(fwd_s=(0.0100, 0.0100), bwd_s=(0.0200, 0.0100), run_units=(30, 30)))[0] == (25, 35)
