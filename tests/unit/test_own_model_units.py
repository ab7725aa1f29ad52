"""Your own model's units as `model.units` names them (issue "Your own model"): a ModuleDict
stands for its children in its order, as a ModuleList does, and a unit without a forward of its
own (a plain container) is refused in one line; both had failed in torch's words ("missing the
required forward")."""

from __future__ import annotations

import pytest

from helpers import REPO
from ppx import config
from ppx.errors import UserError

KEYED = ["1f1b_2cpu", "model.kind=module", "model.data=regression", "model.module=helpers.own_module:keyed"]
KEYED += ["model.hidden=16"]


@pytest.fixture(autouse=True)
def _own_modules(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))  # helpers.own_module


def test_a_moduledict_stands_for_its_children_in_its_order():
    from ppx.models import module, module_spec

    cfg = config.load(KEYED[0], [*KEYED[1:], "model.units=[blocks,head]"])
    names = ["blocks.first", "blocks.second", "blocks.third", "head"]
    assert module_spec.described(cfg.model)[1] == names and cfg.model.layers == 4
    stage = module.build_stage(cfg.model, 0, 1, 2, range(2, 4))  # the third block and the head
    assert [n for n, _ in stage.named_parameters()] == [
        "blocks.third.0.weight",
        "blocks.third.0.bias",
        "head.weight",
        "head.bias",
    ]


def test_a_unit_without_a_forward_of_its_own_is_one_line():
    with pytest.raises(UserError) as e:
        config.load(KEYED[0], [*KEYED[1:], "model.args={holder: true}", "model.units=[parts,head]"])
    assert str(e.value) == (
        "model.units: parts (Module) has no forward of its own, and ppx runs each unit; name the submodules your "
        "forward calls in it"
    )
    cfg = config.load(KEYED[0], [*KEYED[1:], "model.args={holder: true}", "model.units=[parts.blocks,head]"])
    assert cfg.model.layers == 4  # (its ModuleDict, named, runs)
