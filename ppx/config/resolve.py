"""What a config's pipeline section resolves to: the validated schedule and its v."""

from __future__ import annotations

from ppx import schedules
from ppx.config.schema import Config
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.ir.structure import drain_only


def resolve_schedule(cfg: Config) -> Schedule:
    """The validated schedule (with comms) the config asks for; torch's schedules as ppx's
    list of the same order; under ``train.split_backward=drain``, split only where a W fills
    the drain (`ppx.schedules.drained`: `drain_only`, its sends placed for that order)."""
    sched = _built(cfg)
    return schedules.drained(sched) if cfg.train.split_backward == "drain" else sched


def drain_changed(cfg: Config) -> bool:
    """Whether ``train.split_backward=drain`` changes the list the config's schedule builds (a
    list whose every W follows its stage's last forward, or sits in an overlapped cell, runs as
    built)."""
    return cfg.train.split_backward == "drain" and drain_would_change(cfg)


def drain_would_change(cfg: Config) -> bool:
    """Whether ``train.split_backward=drain`` would change the config's list, whatever the key
    says now."""
    sched = _built(cfg)
    return drain_only(sched).actions != sched.actions


def _built(cfg: Config) -> Schedule:
    p = cfg.pipeline
    if schedules.is_csv(p.schedule):
        return schedules.from_csv(p.schedule)
    return schedules.build(p.schedule, p.stages, p.microbatches, virtual_stages(cfg))


def sum_order_note(cfg: Config, sched: Schedule | None = None) -> str | None:
    """Where the config's list (``sched``, resolved already, or None) sums its microbatches out
    of microbatch order (a CSV of one's own: every family's list keeps it), as words to follow
    its name, or None (`ppx.schedules.ir.sum_order`); its I's counted only where they add
    gradients (not under the graph's way, whose I takes the input's gradient alone, nor on
    torch's runtime)."""
    from ppx.schedules.ir.sum_order import out_of_order_note

    torch = schedules.runs_on_torch(cfg.pipeline.schedule, cfg.pipeline.executor)
    sched = resolve_schedule(cfg) if sched is None else sched
    return out_of_order_note(sched, inputs_add=cfg.train.split_backward != "graph" and not torch)


def virtual_stages(cfg: Config) -> int:
    """pipeline.virtual_stages, or the schedule's default (2 for schedules with several stages per rank, else 1)."""
    v = cfg.pipeline.virtual_stages
    return schedules.default_virtual(cfg.pipeline.schedule) if v is None else v
