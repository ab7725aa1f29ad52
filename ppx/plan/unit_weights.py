"""What each of a model's split units (its blocks, and llama's embedding and head) weighs
against the others, for a plan that regroups a run's measured stages into other stages
(`PlanInputs.parts`): each unit's forward FLOPs (its share of a stage's time), the bytes its
forward saves for the backward (its share of a stage's activations, parameters left out, as
the run's memory counters leave them out) and its parameter bytes; and, for stages whose
values do not add up unit by unit (`UnitWeights.of_stage`), its input's bytes and the outputs
selective recomputation keeps, and the weights units share (tied).

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
    one microbatch, parameter bytes; and what a stage's values are made of where they do not
    add up unit by unit: each unit's input bytes (as a stage receives it: floats in the run's
    compute dtype) and the bytes of its outputs that selective recomputation keeps (matmuls,
    attention, in the compute dtype), the targets' bytes, and the parameters several units
    share (tied: the units holding each, its bytes), which a stage holding two of them holds
    once. (Weights from before these were kept have them empty: read as adding up.)"""

    flops: tuple[float, ...]
    saved_bytes: tuple[float, ...]
    param_bytes: tuple[float, ...]
    input_bytes: tuple[float, ...] = ()
    kept_bytes: tuple[float, ...] = ()
    target_bytes: float = 0.0
    shared: tuple[tuple[tuple[int, ...], float], ...] = ()

    def of_stage(self, units: range, by: str, recompute: str = "none") -> list[float]:
        """Each of ``units``' weight in a stage that holds exactly them, ``by`` "bytes" (the
        activations one microbatch leaves until its backward, under ``recompute``: none, all
        it saves; full, the stage's input, and the targets on the last stage; selective, the
        input and the kept outputs), "graph" (what it saves, as if nothing were recomputed),
        "params" (its parameter bytes, a parameter shared with a unit before it in the stage
        left out) or "time" (forward FLOPs)."""
        if by == "params":
            out = [self.param_bytes[u] for u in units]
            for holders, size in self.shared:
                mine = [u for u in holders if u in units]
                for u in mine[1:]:
                    out[u - units.start] -= size
            return out
        if by == "time":
            return [self.flops[u] for u in units]
        if by == "graph" or recompute == "none" or not self.input_bytes:
            return [self.saved_bytes[u] for u in units]
        last = len(self.saved_bytes) - 1
        out = []
        for u in units:
            w = self.kept_bytes[u] if recompute == "selective" else 0.0
            w += self.input_bytes[u] if u == units.start else 0.0
            out.append(w + (self.target_bytes if u == last else 0.0))
        return out

    @classmethod
    def from_json(cls, data: dict) -> UnitWeights:
        """The weights `dataclasses.asdict` wrote (plan.json's ``inputs``)."""
        shared = tuple((tuple(units), float(size)) for units, size in data.get("shared", ()))
        plain = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k != "shared"}
        return cls(**plain, shared=shared)


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
    from ppx.engine.precision import DTYPES

    kind = models.kind(cfg.model.kind)
    n = models.unit_count(cfg.model)
    x, target = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    size = cfg.microbatch_size()
    # (bytes of a float in a mixed run's compute dtype)
    compute = None if cfg.train.dtype == "fp32" else DTYPES[cfg.train.dtype].itemsize
    rows, held = [], {}
    with FakeTensorMode(allow_non_fake_inputs=True) as fake, torch.enable_grad():
        # (each microbatch its own tensor, as the run's are: a view would count the whole batch's storage)
        x, target = fake.from_tensor(x[:size].clone()), fake.from_tensor(target[:size].clone())
        for unit in range(n):
            module = kind.build_stage(cfg.model, cfg.train.seed, unit, n, range(unit, unit + 1), None)
            loss = (lambda out: kind.loss(out, target)) if unit == n - 1 else None
            given = _bytes(x, compute if unit else None)  # (stage 0 keeps the batch's own; later ones receive)
            x, *row = _one_unit(module, x, loss, compute)
            rows.append((*row, given))
            for name, p in getattr(module, "tied_parameters", dict)().items():  # (a weight several units hold)
                held.setdefault(name, (p.numel() * p.element_size(), []))[1].append(unit)
    flops, saved, params, kept, inputs = zip(*rows)
    shared = tuple((tuple(units), float(b)) for b, units in held.values() if len(units) > 1)
    return UnitWeights(flops, saved, params, inputs, kept, float(_bytes(target, None)), shared)


def _bytes(t, compute: int | None) -> float:
    """``t``'s bytes, a float tensor's at ``compute`` bytes an element where given."""
    each = compute if compute is not None and t.is_floating_point() else t.element_size()
    return float(t.numel() * each)


def _one_unit(module, x, loss, compute: int | None) -> tuple:
    """(its output, detached; its forward FLOPs; the bytes it saves for the backward, each
    storage once, its parameters left out; its parameter bytes; the bytes of the outputs
    selective recomputation keeps, at ``compute`` bytes a float where given) of one unit's
    forward on ``x`` (``loss``: the last unit's, applied to its output)."""
    import torch
    from torch.autograd.graph import saved_tensors_hooks
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from ppx.engine.recompute import saves

    selective = [0.0]

    class Kept(TorchDispatchMode):
        def __torch_dispatch__(self, op, types, args=(), kwargs=None):
            out = op(*args, **(kwargs or {}))
            if saves(op, args, kwargs or {}):
                outs = out if isinstance(out, (tuple, list)) else (out,)
                selective[0] += sum(_bytes(t, compute) for t in outs if isinstance(t, torch.Tensor))
            return out

    own = {p.untyped_storage()._cdata for p in module.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage._cdata not in own:
            kept[storage._cdata] = storage.nbytes()
        return t.detach()  # (not t: a node saving its own output would hold itself, a cycle never freed)

    with FlopCounterMode(display=False) as counter, saved_tensors_hooks(pack, lambda t: t), Kept():
        if x.is_floating_point():
            x = x.detach().requires_grad_(True)
        out = module(x)
        if loss is not None:
            out = loss(out)
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    return out.detach(), float(counter.get_total_flops()), float(sum(kept.values())), float(params), selective[0]
