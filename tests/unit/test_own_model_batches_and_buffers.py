"""Your own model's batches and buffers, checked before any work starts (one line each, as
tests/unit/test_own_model_errors.py's): a batch function's sample count and types
(ppx/models/module_chain.py), and a buffer several units share that the forward moves."""

from __future__ import annotations

import pytest

from helpers import REPO
from ppx import config
from ppx.errors import UserError

# helpers/own_module.py's: 4 x (Linear, Tanh), 4 units (an nn.Sequential's own children, as they are)
SEQUENTIAL = ["1f1b_2cpu", "model.kind=module", "model.data=regression", "model.args={width: 16, depth: 4}"]

CASES = {
    "module batch function that gives another sample count than asked": (
        [*SEQUENTIAL, "model.module=helpers.own_module:build", "model.batch_fn=helpers.own_batches:batch_of_ten"],
        "model.batch_fn=helpers.own_batches:batch_of_ten: asked for 32 samples (its batch_size argument), it gives "
        "inputs of shape (10, 16) and targets of shape (10, 16): ppx splits both into microbatches along the first "
        "dimension, so it needs the inputs as one tensor of 32 samples and the targets as one tensor of a multiple",
    ),
    "module batch function right for a microbatch, short for the batch": (  # (it was said by a rank, after the claim)
        [*SEQUENTIAL, "model.module=helpers.own_module:build", "model.batch_fn=helpers.own_batches:batch_capped"],
        "model.batch_fn=helpers.own_batches:batch_capped: asked for 32 samples (its batch_size argument), it gives "
        "inputs of shape (8, 16)",
    ),
    "module batch function whose targets are a tuple": (  # (a rank failed on the first step: no .chunk)
        [
            *SEQUENTIAL,
            "model.module=helpers.own_module:build",
            "model.batch_fn=helpers.own_batches:batch_tuple_targets",
        ],
        "it gives inputs of shape (32, 16) and targets a tuple: ppx splits both",
    ),
    "module buffer shared by units and moved by the forward": (  # (each stage moved its own copy, silently)
        [*SEQUENTIAL, "model.module=helpers.own_stateful:shared_buffer", "model.hidden=16"],
        "model.module: buffer 0.mean is shared by units 0, 3 and moved by the forward, on different stages; each "
        "stage holds its own copy of it, so stages would move theirs apart",
    ),
    "module buffer's view held by a unit of another stage, moved by the forward": (  # (as the buffer itself)
        [*SEQUENTIAL, "model.module=helpers.own_stateful:shared_view", "model.hidden=16"],
        "model.module: buffer 0.mean is shared by units 0, 3 and moved by the forward, on different stages",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_one_line_before_any_work(case, monkeypatch):
    (experiment, *overrides), expected = CASES[case]
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    with pytest.raises(UserError) as e:
        config.load(experiment, overrides)
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_targets_flattened_to_a_row_per_feature_are_split_with_their_samples(monkeypatch):
    """Targets of a multiple of the samples' rows (a target per token, flattened) split along
    with their inputs: accepted (the sample count check had refused them)."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    own = ["model.module=helpers.own_module:build", "model.batch_fn=helpers.own_batches:batch_flat_targets"]
    cfg = config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], *own, "model.loss_fn=helpers.own_batches:loss_flat"])
    assert cfg.model.layers == 4


def test_a_constant_buffer_shared_by_units_splits_as_the_model_does(monkeypatch):
    """A table two units read and none moves (a shared rotary table): each stage's copy is the
    same, so the split is not refused as a moved one is."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    own = ["model.module=helpers.own_stateful:shared_buffer", "model.hidden=16", "model.args={moves: false}"]
    assert config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], *own]).model.layers == 4


def test_a_moved_buffer_two_units_of_one_stage_share_splits_as_the_model_does(monkeypatch):
    """Units 0 and 1 share a running mean unit 0 moves, and one stage holds both (2, 2): one copy,
    as in the model (it was refused, with the advice to do what the split did)."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    own = ["model.module=helpers.own_stateful:shared_next_door", "model.hidden=16"]
    assert config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], *own, "pipeline.layers_per_stage=[2,2]"]).model.layers == 4
    with pytest.raises(UserError, match="shared by units 0, 1 and moved by the forward, on different stages"):
        config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], *own, "pipeline.layers_per_stage=[1,3]"])
