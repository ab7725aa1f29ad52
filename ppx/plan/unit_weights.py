"""What each of a model's split units (its blocks, and llama's embedding and head) weighs
against the others, for a plan that regroups a run's measured stages into other stages
(`PlanInputs.parts`): each unit's forward FLOPs (its share of a stage's time), the bytes its
forward saves for the backward (its share of a stage's activations, parameters left out, as
the run's memory counters leave them out) and its parameter bytes.

They come from one forward of a microbatch through the model, unit by unit, built under
``FakeTensorMode``: tensors with shapes and no storage, so a model of billions of parameters
costs no memory and about a second. On llama-tiny a block's saved bytes come out as the run
measures them (726016), its head's within 2%; its embedding, 0 FLOPs, takes no share of a
stage's time (the time its run stage measured goes to the blocks beside it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UnitWeights:
    """Per model unit, in the split's order: forward FLOPs, bytes saved for the backward by
    one microbatch, parameter bytes."""

    flops: tuple[float, ...]
    saved_bytes: tuple[float, ...]
    param_bytes: tuple[float, ...]


def unit_weights(cfg) -> UnitWeights | None:
    """The units' weights of the run config ``cfg``'s model, or None where they cannot be had
    (the known-cost model, whose units sleep; a model that does not build or run on fake
    tensors): a plan then shares a stage's values equally among its units."""
    if cfg.model.kind == "synthetic":
        return None
    try:
        return _weigh(cfg)
    except Exception:  # a model of the user's own that fake tensors cannot run: equal shares
        return None


def _weigh(cfg) -> UnitWeights:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ppx import models

    kind = models.kind(cfg.model.kind)
    n = models.unit_count(cfg.model)
    x, target = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    size = cfg.train.batch_size // (cfg.pipeline.microbatches * cfg.parallel.data)
    rows = []
    with FakeTensorMode(allow_non_fake_inputs=True) as fake, torch.enable_grad():
        # (each microbatch its own tensor, as the run's are: a view would count the whole batch's storage)
        x, target = fake.from_tensor(x[:size].clone()), fake.from_tensor(target[:size].clone())
        for unit in range(n):
            module = kind.build_stage(cfg.model, cfg.train.seed, unit, n, range(unit, unit + 1), None)
            loss = (lambda out: kind.loss(out, target)) if unit == n - 1 else None
            x, *row = _one_unit(module, x, loss)
            rows.append(row)
    flops, saved, params = zip(*rows)
    return UnitWeights(flops, saved, params)


def _one_unit(module, x, loss) -> tuple:
    """(its output, detached; its forward FLOPs; the bytes it saves for the backward, each
    storage once, its parameters left out; its parameter bytes) of one unit's forward on ``x``
    (``loss``: the last unit's, applied to its output)."""
    from torch.autograd.graph import saved_tensors_hooks
    from torch.utils.flop_counter import FlopCounterMode

    own = {p.untyped_storage()._cdata for p in module.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage._cdata not in own:
            kept[storage._cdata] = storage.nbytes()
        return t.detach()  # (not t: a node saving its own output would hold itself, a cycle never freed)

    with FlopCounterMode(display=False) as counter, saved_tensors_hooks(pack, lambda t: t):
        if x.is_floating_point():
            x = x.detach().requires_grad_(True)
        out = module(x)
        if loss is not None:
            out = loss(out)
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    return out.detach(), float(counter.get_total_flops()), float(sum(kept.values())), float(params)
