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


def test_the_first_and_last_units_save_one_microbatchs_input_and_targets():
    """Each microbatch its own tensor, as the run's are (`RankPipeline.microbatches`): a view
    into the batch had counted the whole batch's storage for the first unit's input and the
    last's targets (the MLP's first unit 2.5x a middle one's, its regrouped stages' memory off)."""
    cfg = config.load("1f1b_2cpu", [])
    w = unit_weights(cfg)
    mb = cfg.train.batch_size // cfg.pipeline.microbatches
    assert w.saved_bytes[:3] == (2 * mb * cfg.model.hidden * 4,) * 3  # each Linear's and GELU's input, fp32
    assert w.saved_bytes[3] == 2 * w.saved_bytes[0]  # and the loss's output and targets
    cfg = config.load("llama_tiny_1f1b_2cpu", [])
    mb = cfg.train.batch_size // cfg.pipeline.microbatches
    assert unit_weights(cfg).saved_bytes[0] == mb * cfg.model.seq_len * 8  # the embedding's token ids, int64


def test_saved_bytes_follow_the_microbatch():
    one = unit_weights(config.load("transformer_1f1b_2cpu", ["pipeline.microbatches=4"]))
    two = unit_weights(config.load("transformer_1f1b_2cpu", ["pipeline.microbatches=2"]))
    # twice the tokens, twice the activations (but for what every microbatch saves alike: a mask, positions)
    assert [2 * b for b in one.saved_bytes] == pytest.approx(two.saved_bytes, rel=0.01)
    assert one.param_bytes == two.param_bytes and one.flops != two.flops


def test_the_known_cost_model_has_none():
    assert unit_weights(config.load("1f1b_2cpu", ["model.kind=synthetic"])) is None


@pytest.mark.parametrize("exp", ["hf_llama_tiny_1f1b_2cpu", "hf_gpt2_tiny_gpipe_2cpu", "hf_qwen2_tiny_zbv_2cpu"])
def test_hugging_face_units_weigh_as_a_real_forward_saves(exp):
    """A Hugging Face model's units are weighed too (its build moved meta weights onto the CPU by
    swapping them in place, which fake tensors refuse: they went in equal shares, the embedding a
    block's bytes), a unit's saved bytes on fake tensors those a real forward saves (on fake
    tensors transformers' attention had taken its tracing path, a causal mask, and K and V
    repeated over the query heads where a real forward lets SDPA share them: llama-tiny's blocks
    +8.7%, Qwen2's +17% at 128 tokens; the mask is now made on a real tensor of that shape)."""
    import torch
    from torch.autograd.graph import saved_tensors_hooks

    from ppx import models

    cfg = config.load(exp, [])
    w = unit_weights(cfg)
    assert w is not None and w.flops[0] == 0 and w.saved_bytes[0] < 0.01 * w.saved_bytes[1], w
    kind, n = models.kind(cfg.model.kind), models.unit_count(cfg.model)
    x, target = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    size = cfg.train.batch_size // cfg.pipeline.microbatches
    x, target = x[:size].clone(), target[:size].clone()  # (each its own tensor, as the run's microbatches)
    for unit in range(n):  # each unit on real tensors, its saved storages counted once, parameters left out
        module = kind.build_stage(cfg.model, cfg.train.seed, unit, n, range(unit, unit + 1), None)
        own = {p.untyped_storage().data_ptr() for p in module.parameters()}
        saved = {}

        def pack(t, saved=saved, own=own):
            if t.untyped_storage().data_ptr() not in own:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t.detach()

        with saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
            out = module(x.detach().requires_grad_(True) if x.is_floating_point() else x)
            if unit == n - 1:
                kind.loss(out, target)
        assert sum(saved.values()) == pytest.approx(w.saved_bytes[unit], rel=0.01), (unit, sum(saved.values()), w)
        x = out.detach()


def test_a_stage_keeps_what_its_recomputation_keeps_and_holds_a_tied_weight_once(monkeypatch):
    """What a stage's bytes are made of where they do not add up unit by unit: under full
    recomputation its input (and the targets on the last stage), under selective its input and
    its matmuls' and attention's outputs (in the compute dtype), and a weight two of its units
    share (the embedding and the head tied) once."""
    from helpers import REPO

    cfg = config.load("llama_tiny_1f1b_2cpu", ["train.dtype=bf16"])
    w = unit_weights(cfg)
    mb = cfg.train.batch_size // cfg.pipeline.microbatches
    block = mb * cfg.model.seq_len * cfg.model.hidden * 2  # a block's input, received in bf16
    assert w.input_bytes[1:] == (block,) * 5 and w.input_bytes[0] == mb * cfg.model.seq_len * 8
    assert w.of_stage(range(1, 3), "bytes", "full") == [block, 0.0]  # (the second block's input is the first's work)
    assert w.of_stage(range(4, 6), "bytes", "full") == [block, w.target_bytes]
    assert w.of_stage(range(1, 3), "bytes", "selective") == [block + w.kept_bytes[1], w.kept_bytes[2]]
    assert 0 < w.kept_bytes[1] < w.saved_bytes[1] and w.of_stage(range(1, 3), "bytes") == list(w.saved_bytes[1:3])
    assert w.shared == ()  # (llama's embedding and head are not tied)
    monkeypatch.chdir(REPO)
    tied = unit_weights(config.load("examples/tiny_gpt.yaml", []))
    ((holders, size),) = tied.shared
    n = len(tied.flops)
    assert holders == (0, n - 1) and 0 < size <= min(tied.param_bytes[0], tied.param_bytes[-1])
    assert tied.of_stage(range(n), "params")[-1] == tied.param_bytes[-1] - size  # (the head's copy is the embedding's)
    assert tied.of_stage(range(1, n), "params")[-1] == tied.param_bytes[-1]
