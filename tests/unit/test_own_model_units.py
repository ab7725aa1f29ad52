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
    names = ["blocks.second", "blocks.first", "blocks.third", "head"]  # (the dict's order, not sorted)
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


CHAIN = ["1f1b_2cpu", "model.kind=module", "model.data=regression", "model.module=helpers.own_module:chain"]
CHAIN += ["model.units=[inp,blocks,out]", "model.hidden=16", "model.layers=5"]


@pytest.mark.parametrize(
    "way, said",
    [
        (
            "skip",
            "hands unit out something other than unit blocks.2's output alone (another tensor, or changed in place)",
        ),
        ("in_place", "hands unit out something other than unit blocks.2's output alone"),
        ("twice", "calls unit blocks.0 2 times, where the split runs each unit once"),
        ("scaled", "returns another tensor than the last unit's output"),
    ],
)
@pytest.mark.parametrize("branch", ["branch", "dim_branch"])
def test_a_forward_torch_fx_cannot_trace_is_checked_by_running_it(way, said, branch):
    """A forward with control flow on a value or a shape (which torch.fx cannot trace) is run once
    on a first microbatch with hooks on its units, on the meta device or, where meta cannot run
    it (a value), on the CPU: what it does besides calling them in turn is refused as a traced
    one is (it was not checked at all)."""
    with pytest.raises(UserError) as e:
        config.load(CHAIN[0], [*CHAIN[1:], f"model.args={{way: {branch}+{way}}}"])
    assert str(e.value).startswith(f"model.module=helpers.own_module:chain: its forward {said}"), str(e.value)


def test_a_unit_whose_own_pre_hook_hands_it_a_new_tensor_is_no_mistake():
    """ppx's split calls the unit, so its hooks run there too: the check sees what the unit
    before handed it, before the unit's own hook."""
    config.load(CHAIN[0], [*CHAIN[1:], "model.args={way: branch+hooked}"])


def test_an_untraced_forward_that_calls_a_training_unit_without_grad_is_refused():
    with pytest.raises(UserError) as e:
        config.load(CHAIN[0], [*CHAIN[1:], "model.args={way: branch+no_grad}"])
    assert str(e.value).startswith("model.module=helpers.own_module:chain: its forward calls unit blocks.1 with "), e
    config.load(CHAIN[0], [*CHAIN[1:], "model.args={way: branch+frozen_inp}"])  # (a frozen extractor runs)


def test_the_note_on_an_untraced_forward_says_how_far_it_was_checked():
    from ppx.commands.run import _forward_unchecked

    note = _forward_unchecked(config.load(CHAIN[0], [*CHAIN[1:], "model.args={way: branch}"]))
    assert note.startswith("ppx: note: torch.fx cannot trace the forward of model.module=helpers.own_module:chain (")
    assert note.endswith(
        "so ppx checked that it only calls model.units in turn by running it once, on one microbatch: a path "
        "another batch takes through it is not checked (ppx runs the units in turn, whatever the forward does)"
    )
    note = _forward_unchecked(config.load(CHAIN[0], [*CHAIN[1:], "model.args={way: branch+fails_alone}"]))
    assert note.endswith(
        "so ppx did not check that it only calls model.units in turn (nor could it run it once: RuntimeError: it "
        "needs its mask): ppx runs them so, whatever the forward does"
    ), note
