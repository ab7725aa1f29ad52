"""schedules/registry.py is the one place that knows schedule names: a family registered
there alone is accepted by the config, built, validated, simulated and given a theory."""

from __future__ import annotations

import pytest

from ppx import config, schedules
from ppx.errors import ScheduleError, UserError
from ppx.schedules import registry
from ppx.schedules.families.basic import one_f_one_b


@pytest.fixture
def toy(monkeypatch):
    """A new family, registered the way a new schedule is: one entry in FAMILIES."""
    fam = registry.Family(
        "toy_1f1b",
        lambda p, m, v: one_f_one_b(p, m),
        lambda p, m, v=1: (p - 1) / (m + p - 1),
        "(p-1)/(m+p-1)",
        "1F1B under another name",
        shape_rule=lambda p, m, v: "toy_1f1b needs m >= p" if m < p else None,
    )
    monkeypatch.setitem(registry.FAMILIES, fam.name, fam)
    return fam


def test_a_family_registered_alone_runs_everywhere(toy):
    cfg = config.load(None, ["pipeline.schedule=toy_1f1b", "pipeline.stages=2", "pipeline.microbatches=4"])
    sched = config.resolve_schedule(cfg)
    assert sched.num_ranks == 2 and sched.num_microbatches == 4
    assert "toy_1f1b" in registry.names() and "toy_1f1b" in registry.names_help()
    t = schedules.simulate(sched, schedules.Costs(fwd=1, bwd=1))
    assert t.bubble_fraction() == pytest.approx(registry.theory_bubble("toy_1f1b", 2, 4))


def test_shape_rules_come_from_the_family(toy):
    with pytest.raises(UserError, match="toy_1f1b needs m >= p"):
        config.load(
            None, ["pipeline.schedule=toy_1f1b", "pipeline.stages=4", "pipeline.microbatches=2", "train.batch_size=8"]
        )
    assert registry.theory_bubble("toy_1f1b", 4, 2) is None  # no theory for a shape the family refuses


def test_interleaved_theory_needs_its_shape():
    assert registry.theory_bubble("interleaved_1f1b", 2, 3, 2) is None
    assert registry.theory_bubble("torch_interleaved1f1b", 2, 4, 2) == pytest.approx(1 / 9)


def test_torch_aliases_and_defaults():
    assert registry.family_name("torch_1f1b") == "1f1b" and registry.is_torch("torch_1f1b")
    assert registry.runs_on_torch("1f1b", "torch") and not registry.runs_on_torch("1f1b", "ppx")
    assert registry.default_virtual("torch_interleaved1f1b") == 2 and registry.default_virtual("gpipe") == 1
    assert registry.default_virtual("my.csv") == 1
    assert registry.build("torch_interleaved1f1b", 2, 4).num_stages == 4
    with pytest.raises(ScheduleError, match="unknown schedule 'nope'"):
        registry.family("nope")
