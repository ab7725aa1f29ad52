"""How a candidate's schedule is built: a registry family by name, or the automatic
zero-bubble schedule for the plan's costs and budget (``zb_auto``, `ppx.schedules.auto.auto_zb`:
without a budget, within 1F1B's memory on every rank)."""

from __future__ import annotations

from ppx.errors import ScheduleError
from ppx.plan.inputs import PlanInputs
from ppx.schedules import registry
from ppx.schedules.auto.auto_zb import auto_zb
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.placing.placement import place_comms

AUTO = "zb_auto"
DRAIN = "+drain"  # a candidate's name suffix: its family's list as train.split_backward=drain runs it


def family_of(name: str) -> str:
    """The schedule a candidate's name builds (``zb_h1+drain``: zb_h1)."""
    return name.removesuffix(DRAIN)


def rank_limits(inputs: PlanInputs, p: int, v: int) -> list[float] | None:
    """Each rank's activation budget, bytes: the budget less the params of its stages (None:
    no budget). Stage-to-rank as one stage per rank (the automatic schedule's placement)."""
    if inputs.budget_bytes is None:
        return None
    params = inputs.params(p * v)
    return [inputs.budget_bytes - params[r] for r in range(p)]


def _one(limits: list[float] | None) -> float | list[float] | None:
    """One value where every rank's limit is the same (zb_auto's ladder then never wastes any)."""
    return limits[0] if limits and len(set(limits)) == 1 else limits


def build(name: str, p: int, m: int, v: int, inputs: PlanInputs) -> Schedule:
    """The placed, validated schedule of a candidate; ScheduleError for a shape it refuses (or,
    ``+drain``, where drain changes nothing: every W follows its stage's last F)."""
    if name.endswith(DRAIN):
        from ppx.schedules.ir.structure import drain_keeps
        from ppx.schedules.registry import drained

        full = build(family_of(name), p, m, v, inputs)
        out = drained(full, inputs.transport)
        if out is full:
            raise ScheduleError(f"drain changes nothing at m={m}: {drain_keeps(full)}")
        return out
    if name == AUTO:
        costs = inputs.costs(p)
        act = inputs.act(p) if inputs.act_bytes else None
        # zb_auto's accounting has no I that adds (a negative share: recomputation): it places
        # as if that I held nothing more, and the plan's walk (evaluate) counts what it holds
        share = [max(0.0, s) for s in inputs.shares(p)] if act else 0.0
        compute = auto_zb(p, m, costs, act, _one(rank_limits(inputs, p, 1)), share, inputs.rank_by)
        return place_comms(compute, inputs.transport)
    return registry.build(name, p, m, v, inputs.transport)
