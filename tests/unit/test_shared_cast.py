"""In a mixed dtype, routed layers that take the same wider input in a row (Hugging Face
Llama's q, k and v projections take one RMSNorm's fp32 output) share one compute-dtype copy of
it, where autocast casts it again for each layer and each graph keeps its own."""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from ppx.engine.linears import StepWeights, route_layers

BF16 = torch.bfloat16


def _three_projections():
    torch.manual_seed(0)
    return nn.ModuleList([nn.Linear(16, 24) for _ in range(3)])


def _run(mods, x, weights=None):
    """The three layers on ``x`` under bf16 autocast: (outputs, the bf16 tensors of ``x``'s
    shape their graphs saved)."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    shared = weights.sharing_casts() if weights is not None else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), shared, torch.autocast("cpu", dtype=BF16):
        outs = [m(x) for m in mods]
    copies = {t.untyped_storage().data_ptr() for t in saved if t.dtype == BF16 and t.shape == x.shape}
    return outs, copies


def test_layers_taking_one_fp32_input_save_one_bf16_copy_and_give_autocasts_gradients():
    ref = _three_projections()
    mods = copy.deepcopy(ref)
    weights = StepWeights(BF16)
    route_layers(mods, weights)
    weights.refresh()
    leaf = torch.randn(5, 16, requires_grad=True)
    # (autocast keeps one cast of a leaf that needs a gradient; a norm's output is none)
    want, ref_copies = _run(ref, leaf * 2)
    got, copies = _run(mods, leaf * 2, weights)
    assert len(ref_copies) == 3 and len(copies) == 1  # autocast: a copy per layer; ppx: one
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    gys = [torch.randn_like(o) for o in got]
    got_grads = torch.autograd.grad(got, [leaf, *mods.parameters()], gys)
    parts = [torch.autograd.grad(o, leaf, g, retain_graph=True)[0] for o, g in zip(want, gys)]
    want_grads = torch.autograd.grad(want, [leaf, *ref.parameters()], gys)
    for a, b in zip(got_grads[1:], want_grads[1:]):  # each weight's gradient from the same bf16 copy
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    # the input's: the three meet in bf16 at the one copy, where autocast sums them in fp32: two
    # bf16 roundings of the three layers' parts apart at most
    bound = 2**-7 * sum(p.abs() for p in parts)
    assert ((got_grads[0] - want_grads[0]).abs() <= bound).all()
    assert weights._last_cast is None  # nothing kept past the forward


def test_an_input_changed_in_place_or_another_grad_mode_is_cast_again():
    mods = _three_projections()
    weights = StepWeights(BF16)
    (a, b, c) = route_layers(mods, weights)
    weights.refresh()
    x = torch.randn(5, 16)
    assert weights.cast(x, BF16) is not weights.cast(x, BF16)  # outside a stage's forward: autocast's way
    with weights.sharing_casts():
        first = weights.cast(x, BF16)
        assert weights.cast(x, BF16) is first  # the same input in a row: the same copy
        x.add_(1.0)
        second = weights.cast(x, BF16)
        assert second is not first and torch.equal(second, x.to(BF16))
        with torch.no_grad():
            assert weights.cast(x, BF16) is not second
        assert weights.cast(x.clone(), BF16) is not second  # another tensor, equal values: its own
    assert weights._last_cast is None  # nothing kept after the block
