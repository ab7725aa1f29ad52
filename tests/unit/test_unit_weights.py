"""`ppx.plan.unit_weights`: each split unit's forward FLOPs, saved bytes and parameter bytes,
from the model built on fake tensors (no memory: llama-1b's 18 units take well under a
second), and None where there are none to have."""

from __future__ import annotations

import pytest

from ppx import config
from ppx.plan.unit_weights import unit_weights


def test_llama_units_weigh_as_their_work():
    w = unit_weights(config.load("llama_tiny_1f1b_2cpu", []))
    assert len(w.flops) == len(w.saved_bytes) == len(w.param_bytes) == 4 + 2  # embedding, 4 blocks, head
    assert w.flops[0] == 0 and len(set(w.flops[1:-1])) == 1 and 0 < w.flops[-1] < w.flops[1]
    assert len(set(w.saved_bytes[1:-1])) == 1 and w.saved_bytes[0] < 0.01 * w.saved_bytes[1]
    # the embedding and the head hold vocabulary x hidden weights, a block its own
    assert w.param_bytes[0] == 256 * 64 * 4 and len(set(w.param_bytes[1:-1])) == 1
    big = unit_weights(config.load("llama1b_1f1b_8gpu", []))  # 1.2 billion parameters, none allocated
    assert len(big.flops) == 16 + 2 and sum(big.param_bytes) > 4e9


def test_saved_bytes_follow_the_microbatch():
    one = unit_weights(config.load("transformer_1f1b_2cpu", ["pipeline.microbatches=4"]))
    two = unit_weights(config.load("transformer_1f1b_2cpu", ["pipeline.microbatches=2"]))
    # twice the tokens, twice the activations (but for what every microbatch saves alike: a mask, positions)
    assert [2 * b for b in one.saved_bytes] == pytest.approx(two.saved_bytes, rel=0.01)
    assert one.param_bytes == two.param_bytes and one.flops != two.flops


def test_the_known_cost_model_has_none():
    assert unit_weights(config.load("1f1b_2cpu", ["model.kind=synthetic"])) is None
