"""The known-cost model's per-stage costs, read from the config (no torch needed: the
launcher checks them before any process starts)."""

from __future__ import annotations

from numbers import Real

from ppx.errors import UserError


def per_stage_ms(name: str, value, num_stages: int | None) -> list[float]:
    """One cost in ms per stage from one number or one number per stage; ``name`` (a config
    key or a command-line option) names it in the error. ``num_stages`` None checks the
    values alone (a list of any length; one number gives one value)."""
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
            raise UserError(f"{name} must be one number or {count} (one per stage), got {values}")
        values = [float(v) for v in values]
    else:
        raise UserError(f"{name} must be a number of milliseconds or a list of them, got {value!r}")
    if any(v < 0 for v in values):
        raise UserError(f"{name} must not be negative, got {values}")
    return values


def stage_costs_ms(cfg, num_stages: int | None) -> tuple[list[float], list[float], list[float]]:
    """Per-stage (forward, input-gradient backward, weight-gradient backward) costs in ms,
    each from one value or one value per stage (``num_stages`` None: see `per_stage_ms`)."""
    return tuple(
        per_stage_ms(f"model.{key}", getattr(cfg, key), num_stages) for key in ("fwd_ms", "bwd_ms", "wgrad_ms")
    )
