"""``model.kind=module``: your own nn.Module (`ppx.models.module_spec`: the import path, its
units, the checks), split into stages of whole units.

Every stage builds the whole model with the run's seed (so a unit's weights are the same
whatever the split) and keeps its units, under their names in your model (a stage's state_dict
keys are your model's). A stage's forward calls its units in turn, as your model's forward
does. A parameter several units share (a tied embedding) is held by each stage that has one
of them, and the engine sums its copies' gradients every step (``tied_units``). Each unit's
dropout masks are seeded by the microbatch and the unit (`ppx.models.seeding.seed_unit`). Data and loss:
``model.batch_fn`` / ``model.loss_fn`` (import paths), or ppx's (``model.data``: the transformer
kind's token walks and next-token cross-entropy, or the MLP kind's regression and MSE). Each
stage receives what the unit before it hands on, its shape and dtype found by running the
model once on the meta device (no memory, no compute)."""

from __future__ import annotations

import torch
from torch import nn

from ppx.errors import UserError
from ppx.models import mlp, module_chain, module_spec, transformer
from ppx.models.seeding import DATA, mix, seed_unit, seeded

_LOSS: dict = {}  # the run's loss (set when a stage is built; the kind's ``loss`` takes no config)
SEEDS_UNITS = True  # each unit seeds its random ops per microbatch (`seed_unit`): the runtime keys each action
MOVES_BUFFERS = True  # a forward may move buffers (a running mean): a recomputation finds them as its forward did


class UnitStage(nn.Module):
    """Units ``names`` of ``model``, called in turn, kept under their dotted names; ``tied``:
    this stage's copies of parameters several units share, by their name in ``model``."""

    def __init__(self, model: nn.Module, names: list[str], tied: dict[str, nn.Parameter], first: int = 0):
        super().__init__()
        subs = dict(model.named_modules())
        self.units = list(names)
        self.first_unit = first  # the index of names[0] among the model's units (`seed_unit`)
        for name in names:
            parent = self
            *path, last = name.split(".")
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = getattr(parent, part)
            parent.add_module(last, subs[name])
        # each tied weight by its path in this stage, looked up when asked: data parallel
        # replaces the parameters with its own (DTensors) after the build
        mine = {id(q): n for n, q in self.named_parameters(remove_duplicate=False)}
        self._tied = {key: mine[id(q)] for key, q in tied.items()}

    def forward(self, x):
        for k, name in enumerate(self.units):
            seed_unit(self.first_unit + k)
            x = self.get_submodule(name)(x)
        return x

    def tied_parameters(self) -> dict[str, nn.Parameter]:
        return {key: self.get_parameter(path) for key, path in self._tied.items()}


def whole(cfg, seed: int) -> tuple[nn.Module, list[str]]:
    """The whole model, built with the run's seed, and its unit names."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(mix(seed, 0))
        model = module_spec.build(cfg)
    return model, module_spec.units(cfg, model)


def build_stage(cfg, seed: int, stage: int, num_stages: int, blocks: range, clock=None) -> nn.Module:
    """The units ``blocks`` (indices into the unit list) of the model built with ``seed``."""
    _LOSS["fn"] = (
        module_spec.load_function(cfg.loss_fn, "model.loss_fn")
        if cfg.loss_fn
        else (transformer.loss if cfg.data == "tokens" else mlp.loss)
    )
    model, names = whole(cfg, seed)
    mine = [names[u] for u in blocks]
    held = {id(p) for n in mine for p in model.get_submodule(n).parameters()}
    tied = {key: model.get_parameter(key) for key, units in module_spec.shared_in(model, names) if len(units) > 1}
    return UnitStage(model, mine, {k: p for k, p in tied.items() if id(p) in held}, blocks.start)


def tied_units(cfg) -> dict[str, tuple[int, ...]]:
    """Parameters several units share, by their name in the model: the units holding each."""
    return {name: tuple(units) for name, units in module_spec.shared(cfg) if len(units) > 1}


def block_name(cfg, block: int) -> str:
    """Unit ``block``'s name (a split point, for pipeline.split=tracer)."""
    return module_spec.described(cfg)[1][block]


def make_batch(cfg, seed: int, batch_size: int, step: int):
    """Step ``step``'s batch. Your ``model.batch_fn`` gets the model section as your model
    function does, and runs with torch's CPU generator seeded from ``seed`` and ``step`` (given
    back after): one that draws from it (``torch.randn`` without a generator) gives every rank
    the same batch, on every run (ranks had drawn their inputs and targets apart)."""
    if cfg.batch_fn:
        fn = module_spec.load_function(cfg.batch_fn, "model.batch_fn")
        with seeded(mix(seed, step), DATA):
            return fn(module_spec.section(cfg), seed, batch_size, step)
    return (transformer if cfg.data == "tokens" else mlp).make_batch(cfg, seed, batch_size, step)


def loss(output, target):
    if "fn" not in _LOSS:
        raise UserError("model.kind=module: no stage of the model was built, so it has no loss yet")
    return _LOSS["fn"](output, target)


def unit_outputs(
    cfg, microbatch_size: int, described: tuple | None = None
) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """What each unit but the last hands on (shape, dtype), from `module_chain.unit_shapes`:
    units may hand on tensors of different shapes and dtypes (a CNN's narrowing feature maps,
    an MLP's widths), each stage receiving its own (`ppx.models.handed_on`)."""
    return [(shape, dtype) for _, shape, dtype in module_chain.unit_shapes(cfg, microbatch_size, described)]
