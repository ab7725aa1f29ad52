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
