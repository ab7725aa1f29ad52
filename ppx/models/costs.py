"""The known-cost model's per-stage costs, read from the config (no torch needed: the
launcher checks them before any process starts).

``model.cost_per=stage`` (the default): ``model.fwd_ms``/``bwd_ms``/``wgrad_ms`` are each
stage's, one value or one per stage. ``model.cost_per=layer``: they are each layer's, one
value or one per layer (``model.layers`` of them), and a stage costs the sum over the layers
the split gives it (`ppx.models.split`), so a step's work is the same whatever the number of
stages: 1F1B on p ranks and interleaved 1F1B with v stages per rank do equal work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

from ppx.errors import UserError
from ppx.models.split import split_layers

KEYS = ("fwd_ms", "bwd_ms", "wgrad_ms")


def per_stage_ms(name: str, value, num_stages: int | None, per: str = "stage", typed: str | None = None) -> list[float]:
    """One cost in ms per stage from one number or one number per stage; ``name`` (a config
    key or a command-line option) names it in the error, which quotes ``typed`` (the option's
    text as given) or the value. ``num_stages`` None checks the values alone (a list of any
    length; one number gives one value). ``per`` names what the values are of in the error
    ("layer": one per layer)."""
    shown = value if typed is None else typed
    if isinstance(value, Real) and not isinstance(value, bool):
        values = [float(value)] * (num_stages or 1)
    elif isinstance(value, (list, tuple)) or hasattr(value, "__len__") and not isinstance(value, str):
        values = list(value)
        if (
            num_stages is not None
            and len(values) != num_stages
            or not all(isinstance(v, Real) and not isinstance(v, bool) for v in values)
        ):
            count = f"{num_stages} numbers" if num_stages is not None else "a list of numbers"
            raise UserError(f"{name} must be one number or {count} (one per {per}), got {shown}")
        values = [float(v) for v in values]
    else:
        raise UserError(f"{name} must be a number of milliseconds or a list of them, got {value!r}")
    if not all(map(math.isfinite, values)):
        raise UserError(f"{name} must be finite milliseconds, got {shown}")
    if any(v < 0 for v in values):
        raise UserError(f"{name} must not be negative, got {shown}")
    if any(v > MAX_MS for v in values):  # (1e308 is finite, but a step's sum of them is not)
        raise UserError(f"{name} must be at most {MAX_MS:g} ms (about 30 years), got {shown}")
    return values


MAX_MS = 1e12


def per_layer(cfg) -> bool:
    """Whether the model's costs are per layer (``model.cost_per=layer``)."""
    return getattr(cfg, "cost_per", "stage") == "layer"


def layer_costs_ms(cfg) -> tuple[list[float], list[float], list[float]]:
    """Per-layer (forward, input-gradient, weight-gradient) costs in ms, ``model.layers`` of
    each, in ``model.cost_per=layer``."""
    return tuple(
        per_stage_ms(f"model.{key}", getattr(cfg, key), cfg.layers, "layer, model.cost_per=layer") for key in KEYS
    )


def blocks_cost_ms(cfg, blocks: Sequence[int]) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) ms of a stage holding ``blocks``, in
    ``model.cost_per=layer``: the sums of its layers' costs."""
    return tuple(sum(values[i] for i in blocks) for values in layer_costs_ms(cfg))


def stage_costs_ms(
    cfg, num_stages: int | None, layers_per_stage: Sequence[int] | None = None
) -> tuple[list[float], list[float], list[float]]:
    """Per-stage (forward, input-gradient backward, weight-gradient backward) costs in ms of
    the model ``cfg`` split into ``num_stages`` stages. Per stage: each from one value or one
    value per stage. Per layer (``model.cost_per=layer``): each stage the sum over its layers
    (the split of ``model.layers``, even or ``layers_per_stage``). ``num_stages`` None
    checks the values alone (see `per_stage_ms`)."""
    if per_layer(cfg):
        if num_stages is None:
            return tuple(per_stage_ms(f"model.{key}", getattr(cfg, key), None, "layer") for key in KEYS)
        ranges = split_layers(cfg.layers, num_stages, layers_per_stage)
        return tuple(list(costs) for costs in zip(*(blocks_cost_ms(cfg, r) for r in ranges)))
    return tuple(per_stage_ms(f"model.{key}", getattr(cfg, key), num_stages) for key in KEYS)


RECOMPUTE = ("none", "full", "selective")


def recompute_modes(value, num_stages: int | None) -> list[str]:
    """``train.recompute`` per stage: one of `RECOMPUTE` for every stage, or a list of one per
    stage. ``num_stages`` None checks the values alone."""
    if isinstance(value, (list, tuple)) and len(value) == 1:  # [full]: one mode (a run's config has it so)
        value = value[0]
    values = [value] * (num_stages or 1) if isinstance(value, str) else value
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) and v in RECOMPUTE for v in values):
        raise UserError(f"train.recompute must be one of {' | '.join(RECOMPUTE)} or a list of them, got {value!r}")
    if num_stages is not None and len(values) != num_stages:
        raise UserError(
            f"train.recompute has {len(values)} values for {num_stages} stages (give one, or one per stage)"
        )
    return list(values)


def with_recompute(fwd: list[float], bwd: list[float], modes: list[str]) -> list[float]:
    """The input-gradient backward's cost per stage with recomputation: under ``full`` the
    stage's forward runs again first (in B, or in I when the backward is split); under
    ``selective`` the known-cost model recomputes nothing costly (its modelled cost stands for
    the matmuls, whose outputs selective keeps), so the cost stays."""
    return [b + f if mode == "full" else b for f, b, mode in zip(fwd, bwd, modes)]
