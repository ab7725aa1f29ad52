"""A user's model of the plainest kind, for model.kind=module tests: an nn.Sequential (its
children are its units, no model.units needed) with the user's own batch and loss functions."""

from __future__ import annotations

import torch
from torch import nn


def build(model) -> nn.Module:
    """``model.args``: width, depth, and dropout (after each block's activation; 0: none)."""
    width, drop = model.args.get("width", 16), model.args.get("dropout", 0.0)
    return nn.Sequential(*[_block(width, drop) for _ in range(model.args.get("depth", 4))])


def _block(width: int, drop: float) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), *([nn.Dropout(drop)] if drop else []))


def batch(model, seed: int, batch_size: int, step: int):
    """Inputs and targets from the seed and step only: the same on every rank and run."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    width = model.args.get("width", 16)
    x = torch.randn(batch_size, width, generator=g)
    return x, x.flip(-1).sin()


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).abs().mean()  # L1: not ppx's own MSE or cross-entropy


def loss_per_sample(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A mistake: one loss per sample, not their mean (the backward needs one number)."""
    return (output - target).abs().mean(-1)


def build_by_attribute(model) -> nn.Module:
    """docs/running.md's way: ``model.args.width``, as attributes."""
    a = model.args
    return nn.Sequential(*[nn.Sequential(nn.Linear(a.width, a.width), nn.Tanh()) for _ in range(a.depth)])


def uneven(model) -> nn.Module:
    """Units that hand on tensors of two shapes (32, then 16), each stage receiving its own."""
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 16))


def batch_by_attribute(model, seed: int, batch_size: int, step: int):
    """`batch`, reading ``model.args.width`` as an attribute (as docs/running.md's functions do)."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(batch_size, model.args.width, generator=g)
    return x, x.flip(-1).sin()


def batch_that_fails(model, seed: int, batch_size: int, step: int):
    raise RuntimeError("no dataset here")


def build_that_says_nothing(model) -> nn.Module:
    raise ValueError()  # an exception without a message: its type is the one line


class _ReadsValues(nn.Module):
    """A unit that reads its input's values (a meta tensor has none)."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * float(x.abs().max() > 0)


class _Wide(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = nn.Linear(width, 64 * width), nn.Linear(64 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x))


def reads_values_last(model) -> nn.Module:
    """Three units, the first 128 times the others' FLOPs (counted, it would take a stage
    alone), the last unable to run on the meta device (the checks run the chain on the CPU)."""
    return nn.Sequential(_Wide(16), nn.Linear(16, 16), _ReadsValues(16))


class _Chain(nn.Module):
    """inp, blocks.0-2, out, as a user writes them; ``way`` what its forward does besides:
    plain (nothing), skip (adds inp's output to the last block's), twice (calls blocks.0 twice),
    scaled (returns the output doubled), tuple (returns the output and the last block's),
    branch (Python control flow on a value, a branch never taken: torch.fx cannot trace it), in_place (doubles the
    last block's output in place), masked (an optional mask, None as ppx calls it), no_grad
    (calls blocks.1 under torch.no_grad()), frozen_inp (calls inp, whose parameters are frozen,
    under torch.no_grad(): a frozen feature extractor), dim_branch (control flow on a shape, which
    the meta device runs), fails_alone (raises, as a forward needing more than one tensor),
    hooked (blocks.1 with a pre-hook of its own); ways joined by + do each (branch+skip)."""

    def __init__(self, way: str, width: int = 16):
        super().__init__()
        self.way = set(way.split("+"))
        self.inp, self.out = nn.Linear(width, width), nn.Linear(width, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
        if "frozen_inp" in self.way:
            self.inp.requires_grad_(False)
        if "hooked" in self.way:  # (its own pre-hook hands it a new tensor, in the run as in the check)
            self.blocks[1].register_forward_pre_hook(lambda m, a: (a[0] * 1,))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        with torch.set_grad_enabled("frozen_inp" not in self.way):
            h = self.inp(x)
        if mask is not None:
            h = h * mask
        first = h
        for k, block in enumerate(self.blocks):
            with torch.set_grad_enabled(not (k == 1 and "no_grad" in self.way)):
                h = block(h)
            if k == 0 and "twice" in self.way:
                h = block(h)
        if "skip" in self.way:
            h = h + first
        if "branch" in self.way and h.abs().sum() < 0:  # (never taken: the path run is the chain's)
            h = -h
        if "dim_branch" in self.way and h.dim() > 5:  # (torch.fx cannot trace it; meta runs it)
            h = -h
        if "fails_alone" in self.way:
            raise RuntimeError("it needs its mask")
        if "in_place" in self.way:
            h.mul_(2)
        out = self.out(h)
        return (out, h) if "tuple" in self.way else out * 2 if "scaled" in self.way else out


def chain(model) -> nn.Module:
    return _Chain(model.args.get("way", "plain"))


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor):
        return x, x.sum()


def pair_last(model) -> nn.Module:
    """A last unit that returns a tuple (ppx's loss takes one tensor)."""
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), _Pair())


def narrow_head(model) -> nn.Module:
    """One output per sample where the regression targets have 16."""
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 1))


def classes(model, seed: int, batch_size: int, step: int):
    """A classifier's batch: 16 features, a label of 10 classes per sample."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return torch.randn(batch_size, 16, generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def classifier(model) -> nn.Module:
    """10 scores per sample (``model.args.classes``: other than 10, the loss cannot take them)."""
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, model.args.get("classes", 10)))


class _Scaled(nn.Module):
    """tanh(x * a constant): a buffer, which the forward saves, and no parameter."""

    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.scale)


def parameter_free_last(model) -> nn.Module:
    """Linear, a constant's scaling (a buffer), Linear, Tanh: cut [3, 1], the last stage
    holds no parameter, the first a buffer its forward saves for every microbatch."""
    w = model.hidden
    return nn.Sequential(nn.Linear(w, w), _Scaled(w), nn.Linear(w, w), nn.Tanh())


def parameter_free_first(model) -> nn.Module:
    """Tanh, Linear, Tanh, Linear: cut [1, 3], the first stage holds no parameter."""
    w = model.hidden
    return nn.Sequential(nn.Tanh(), nn.Linear(w, w), nn.Tanh(), nn.Linear(w, w))


def batch_normed(model) -> nn.Module:
    """Linear, BatchNorm1d, Linear (a BatchNorm in training refuses a batch of one sample)."""
    return nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Linear(16, 16))


class _TiedAutoencoder(nn.Module):
    """Encodes with its Linear, decodes with that Linear's weight transposed (F.linear): the
    weight is used inside the layer's own call and outside it."""

    def __init__(self, width: int):
        super().__init__()
        self.enc = nn.Linear(width, 2 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(torch.tanh(self.enc(x)), self.enc.weight.t())


class _ScaledLinear(nn.Module):
    """A Linear never called, its weight read scaled (equalized learning rate's way)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(nn.functional.linear(x, self.fc.weight * 0.5, self.fc.bias))


def tied_outside(model) -> nn.Module:
    return _framed(model, _TiedAutoencoder)


def weight_read_only(model) -> nn.Module:
    return _framed(model, _ScaledLinear)


def _framed(model, unit) -> nn.Module:
    """Two ``unit(width)``s between two Linears (``model.args`` width)."""
    width = model.args.get("width", 16)
    return nn.Sequential(nn.Linear(width, width), unit(width), unit(width), nn.Linear(width, width))


class _TokenMixing(nn.Module):
    """MLP-Mixer's token mixing as a unit of its own: its output a transposed view, not
    contiguous in memory (a stage handing it on sent it as it was, which gloo refuses)."""

    def __init__(self, tokens: int):
        super().__init__()
        self.tok = nn.Linear(tokens, tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.tok(x.transpose(1, 2))).transpose(1, 2)


def token_mixing(model) -> nn.Module:
    """(batch, tokens, width) in and out: ``model.args`` tokens and width."""
    tokens, width = model.args.get("tokens", 4), model.args.get("width", 16)
    return nn.Sequential(nn.Linear(width, width), *[_TokenMixing(tokens) for _ in range(3)], nn.Linear(width, width))


def token_batch(model, seed: int, batch_size: int, step: int):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    tokens, width = model.args.get("tokens", 4), model.args.get("width", 16)
    x = torch.randn(batch_size, tokens, width, generator=g)
    return x, torch.tanh(x.flip(1))


class _ToDouble(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def double_middle(model) -> nn.Module:
    """A middle unit that hands on float64 where the others hand on float32, of one shape."""
    return nn.Sequential(nn.Linear(16, 16), _ToDouble(), nn.Linear(16, 16).double())


def build_reading_values(model) -> nn.Module:
    """`build`, its weights scaled by a value read from them (``.item()``: refused on meta)."""
    net = build(model)
    with torch.no_grad():
        top = net[0][0].weight.abs().max().item()
        for p in net.parameters():
            p.div_(max(top, 1.0) * 2)
    return net


def build_from_layers(model) -> nn.Module:
    """An input layer, model.layers blocks and an output layer: model.layers + 2 units."""
    w = model.hidden
    return nn.Sequential(nn.Linear(w, w), *[_block(w, 0.0) for _ in range(model.layers)], nn.Linear(w, w))


class _DoublesItsInput(nn.Module):
    """Doubles its input in place (``relu_``, ``mul_`` on what it is handed), then a Linear."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x.mul_(2))


def in_place_inputs(model) -> nn.Module:
    """Units that change their input in place: pre-activation blocks (an in-place ReLU first,
    the torchvision way), and doubling ones; each may begin a stage."""
    w = model.hidden
    pre = [nn.Sequential(nn.ReLU(inplace=True), nn.Linear(w, w)) for _ in range(2)]
    return nn.Sequential(_DoublesItsInput(w), pre[0], _DoublesItsInput(w), pre[1])


class _Routed(nn.Module):
    """Two experts, each sample routed to one by the sign of its sum (a mixture of experts' top-1
    routing: boolean indexing, which the meta device cannot run: it needs the values)."""

    def __init__(self, width: int):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(2))

    def forward(self, x):
        pick = x.sum(-1) > 0
        out = torch.zeros_like(x)
        out[pick] = self.experts[0](x[pick])
        out[~pick] = self.experts[1](x[~pick])
        return out.tanh()


def routed(model) -> nn.Module:
    w = model.hidden
    return nn.Sequential(nn.Linear(w, w), _Routed(w), _Routed(w), nn.Linear(w, w))


def last_unit_mismatch(model) -> nn.Module:
    """A last unit that takes 32 features where the one before hands on 16."""
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(32, 16))


def loss_on_three_columns(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A mistake: the output against the targets' first three columns (shapes that do not broadcast)."""
    return (output - target[:, :3]).abs().mean()


class _NoGradLinear(nn.Linear):
    """A Linear whose own forward runs without autograd (a frozen projection, written inside)."""

    @torch.no_grad()
    def forward(self, x):
        return super().forward(x)


def no_grad_inside(model) -> nn.Module:
    """Linear, a Linear run under torch.no_grad() in its own forward, two Linears."""
    w = model.hidden
    return nn.Sequential(nn.Linear(w, w), _NoGradLinear(w, w), nn.Linear(w, w), nn.Linear(w, w))


def lazy(model) -> nn.Module:
    """A LazyLinear first: its weight has no shape until a forward."""
    w = model.hidden
    return nn.Sequential(nn.LazyLinear(w), nn.Linear(w, w), nn.Linear(w, w))


class _Keyed(nn.Module):
    """Blocks in a ModuleDict, run in its order; ``holder``: a plain container around them."""

    def __init__(self, holder: bool):
        super().__init__()
        blocks = nn.ModuleDict({k: _block(16, 0.0) for k in ("second", "first", "third")})  # (not sorted)
        if holder:
            self.parts = nn.Module()
            self.parts.blocks = blocks
        else:
            self.blocks = blocks
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (self.parts.blocks if hasattr(self, "parts") else self.blocks).values():
            x = block(x)
        return self.head(x)


def keyed(model) -> nn.Module:
    """``model.args.holder``: the ModuleDict inside an ``nn.Module()`` that has no forward."""
    return _Keyed(model.args.get("holder", False))


class _BreaksOnCall(nn.Module):
    """A Linear that raises from its ``at``-th call on (the checks before a run make an instance
    of their own, and call it once: a run's rank meets the error, in a step)."""

    def __init__(self, width: int, at: int):
        super().__init__()
        self.linear, self.at, self.calls = nn.Linear(width, width), at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls >= self.at:
            raise ValueError("my model broke here")
        return self.linear(x)


def breaks_in_a_run(model) -> nn.Module:
    """Linear, Tanh, a Linear that raises on its ``model.args.at``-th call (3), Tanh."""
    w = model.hidden
    return nn.Sequential(nn.Linear(w, w), nn.Tanh(), _BreaksOnCall(w, model.args.get("at", 3)), nn.Tanh())
