"""A storing stage's parameters swapped in their module slots (data parallel's FSDP puts
other parameter objects there): I, W and the storing forward take the ones held now."""

from __future__ import annotations

import torch
from torch import nn

from ppx.engine.linears import StepWeights, route_layers
from ppx.engine.weight_store import WeightStore


def test_parameters_swapped_in_their_slots_between_steps_take_the_next_steps_gradients():
    """Data parallel (FSDP) puts other parameter objects in a module's slots between steps: I
    and W give each step's gradients to the parameters the module holds in that step, small
    (a norm's) and stored (a Linear's) alike, and none to the ones it held before."""
    torch.manual_seed(0)
    mod = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    store = WeightStore(mod, route_layers(mod, StepWeights(None)))
    x = torch.randn(3, 8, requires_grad=True)

    def step(mb: int) -> None:
        store.begin(mb)
        store.input_pass(mb, mod(x), x, torch.ones(3, 4))
        store.weight_pass(mb)

    step(0)
    before = dict(mod.named_parameters())
    kept = mod[0].weight.grad.clone()
    for sub in (mod[1], mod[2]):
        for name, p in list(sub._parameters.items()):
            setattr(sub, name, nn.Parameter(p.detach().clone()))
    step(1)
    after = dict(mod.named_parameters())
    for name in ("1.weight", "1.bias", "2.weight", "2.bias"):
        assert after[name] is not before[name] and after[name].grad is not None, name
        assert torch.equal(after[name].grad, before[name].grad), name  # each step's gradient once, where it was held
    assert torch.equal(mod[0].weight.grad, 2 * kept)  # the one not swapped: both steps'


def test_a_weight_swapped_in_its_slot_is_the_one_the_next_storing_forward_multiplies_by():
    """A storing layer detaches its weight once, not per call, and takes it again when its slot
    holds another parameter (data parallel swaps them), with no step's refresh between: the
    output, the input gradient and the weight gradient are the new weight's."""
    from torch.nn import functional as F

    torch.manual_seed(0)
    mod = nn.Sequential(nn.Linear(8, 4, bias=False))
    store = WeightStore(mod, route_layers(mod, StepWeights(None)))
    x, gy = torch.randn(3, 8, requires_grad=True), torch.randn(3, 4)
    store.begin(0)
    store.input_pass(0, mod(x), x, gy)
    store.weight_pass(0)
    new = mod[0].weight = nn.Parameter(torch.randn(4, 8))
    ref_y = F.linear(x, new)
    ref_gx, ref_gw = torch.autograd.grad(ref_y, [x, new], gy)
    store.begin(1)
    y = mod(x)
    assert torch.equal(y, ref_y)
    assert torch.equal(store.input_pass(1, y, x, gy), ref_gx)
    store.weight_pass(1)
    assert torch.equal(new.grad, ref_gw)
