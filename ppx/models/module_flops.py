"""What each unit of your own module (``model.kind=module``) weighs in ``pipeline.balance=flops``:
its forward FLOPs per sample (of a two-sample microbatch), counted by torch's FLOP counter
(``torch.utils.flop_counter``) while the model runs on the meta device (no memory, no
compute), as the kind's checks run it. Matmuls, convolutions and attention count (attention
whole, causal or not); elementwise work and lookups count nothing. A unit that cannot run on
the meta device, or a batch function that fails for two samples, leaves the split even."""

from __future__ import annotations

from ppx.errors import UserError

_COUNTED: dict[str, list[float] | None] = {}  # repr of the model section -> its units' FLOPs


def unit_flops(model) -> list[float] | None:
    """Forward FLOPs of each of ``model``'s units (``model.units``, in order) per sample, or
    None when they cannot be counted (then the split is even)."""
    key = repr(model)
    if key not in _COUNTED:
        _COUNTED[key] = _count(model)
    return _COUNTED[key]


def _count(model) -> list[float] | None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ppx.models import module_spec
    from ppx.models.module import make_batch

    module, names = module_spec.described(model)
    out = []
    try:
        x, _ = make_batch(model, 0, 2, 0)  # two samples: a BatchNorm refuses one in training
        h = x.to("meta")
        with torch.no_grad():
            for name in names:
                with FlopCounterMode(display=False) as counter:
                    h = module.get_submodule(name)(h)
                out.append(counter.get_total_flops() / 2)  # (a sample's)
    except UserError:
        raise
    except Exception:  # (the kind's checks say in one line where a unit fails; the last may do what meta cannot)
        return None
    return out
