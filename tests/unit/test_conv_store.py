"""A split backward that stores convolutions (`ppx.engine.linears.ConvKind`): W's weight and
bias gradients from the stored input and output gradient are autograd's own to the bit, in
fp32 and under bf16 autocast; convolutions padded otherwise are left to autograd."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ppx.engine.linears import ConvKind, kind_of

CONVS = {
    "2d": (lambda: nn.Conv2d(8, 16, 3, padding=1), (4, 8, 12, 12)),
    "2d-strided-no-bias": (lambda: nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), (4, 8, 12, 12)),
    "2d-groups-dilated": (lambda: nn.Conv2d(8, 16, 3, groups=4, dilation=2), (4, 8, 12, 12)),
    "1d": (lambda: nn.Conv1d(8, 16, 5, padding=2), (4, 8, 30)),
    "3d": (lambda: nn.Conv3d(4, 8, 3, padding=1), (2, 4, 6, 6, 6)),
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CONVS))
def test_w_of_a_convolution_is_autograds_to_the_bit(name, dtype):
    torch.manual_seed(0)
    make, shape = CONVS[name]
    conv = make()
    kind = kind_of(conv)
    assert isinstance(kind, ConvKind)
    x = torch.randn(*shape, requires_grad=True)
    mixed = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")
    with mixed:
        y = conv(x)  # (the module's own forward, as a plain backward runs it)
    gy = torch.randn_like(y)
    y.backward(gy)
    ref = [conv.weight.grad] + ([conv.bias.grad] if conv.bias is not None else [])
    with mixed:  # (what the stage stored: its input as the convolution took it)
        taken = x.detach().to(torch.bfloat16) if dtype == "bf16" else x.detach()
    gw, gb = kind.grads(gy, taken, conv.bias is not None)
    got = [gw] + ([gb] if conv.bias is not None else [])
    for r, g in zip(ref, got):
        assert torch.equal(r, g.to(r.dtype))
    assert torch.equal(kind.forward(x, conv.weight, conv.bias), conv(x))


def test_a_convolution_padded_otherwise_is_left_to_autograd():
    assert kind_of(nn.Conv2d(4, 4, 3, padding="same")) is None
    assert kind_of(nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")) is None
    assert kind_of(nn.ConvTranspose2d(4, 4, 3)) is None
    assert kind_of(nn.Conv2d(4, 4, 3, padding="valid")) is None  # (padding as a word: left too)


def test_a_cnns_convolutions_and_head_are_routed():
    """helpers/own_shapes.py's CNN: its three convolutions and its Linear head go through ppx
    (a split backward stores them all), where its convolutions had taken their gradients in I."""
    from helpers.own_shapes import convnet
    from ppx.engine.linears import LinearKind, StepWeights, route_layers

    layers = route_layers(convnet(None), StepWeights(None))
    assert [(layer.name, isinstance(layer.kind, ConvKind)) for layer in layers] == [
        ("0.0", True),
        ("1.0", True),
        ("2.0", True),
        ("3.1", False),
    ] and layers[-1].kind is LinearKind


def test_w_reads_the_forwards_weight_layout_and_takes_an_unbatched_input():
    """A channels_last weight (the speed recipe) beside a contiguous input, as a stage receives
    it: mkldnn picks its layout from both, and W's stand-in weight was contiguous (4e-5 apart);
    an unbatched (C, H, W) input had failed at the first W."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, padding=1).to(memory_format=torch.channels_last)
    for x in (torch.randn(4, 8, 12, 12, requires_grad=True), torch.randn(8, 12, 12, requires_grad=True)):
        conv.zero_grad(set_to_none=True)
        y = conv(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        gw, gb = kind_of(conv).grads(gy, x.detach(), True, conv.weight.detach())
        assert torch.equal(gw, conv.weight.grad) and torch.equal(gb, conv.bias.grad)


def test_a_layer_your_model_runs_with_autocast_off_takes_its_own_weights():
    """Under bf16 a routed layer takes the step's bf16 copy; in a region your forward runs with
    autocast off (in fp32) it takes its own weights, as its forward would (the copy had failed:
    "Input type (float) and bias type (BFloat16)")."""
    from ppx.engine.linears import StepWeights, route_layers

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 4)

        def forward(self, x):
            h = self.a(x)
            with torch.autocast("cpu", enabled=False):
                return self.fc(self.b(h.float()).mean((2, 3)))

    torch.manual_seed(0)
    own, routed = Mixed(), Mixed()
    routed.load_state_dict(own.state_dict())
    weights = StepWeights(torch.bfloat16)
    assert len(route_layers(routed, weights)) == 3
    weights.refresh()
    x = torch.randn(2, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = own(x), routed(x)
    assert got.dtype == torch.float32 and torch.equal(got, want)
