"""What a run is held against: its theoretical bubble and, on the known-cost model, its exact
ideal step.

The known-cost model's costs are known, so its theory is exact: the schedule simulated at the
configured per-stage costs with zero communication, under the run's transport semantics. That
is the closed form ((p-1)/(m+p-1) for GPipe and 1F1B, ...) when every stage costs the same,
and what the closed form cannot say otherwise (unequal stages, ZB-H1 with t_w != t_f). Other
models' costs are not known before the run: they get the closed form, which assumes equal
stages, and the summary says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppx import schedules
from ppx.schedules.ir.schedule import Schedule


@dataclass(frozen=True)
class Theory:
    bubble_fraction: float | None  # idle / step time; None without a closed form or known costs
    ideal_step_time_s: float | None  # the known-cost model's zero-communication step, else None
    basis: str  # how bubble_fraction was obtained, for summary.json
    # each rank's idle / step time where the costs are known (the known-cost model: unequal
    # stages idle apart); None where theory says one share for every rank (the closed form)
    idle_fraction_by_rank: tuple[float, ...] | None = None


def known_cost_timeline(cfg, schedule: Schedule, transport: tuple[str, int]):
    """The known-cost model's step simulated at its configured costs, zero communication,
    under ``transport`` (`prediction.transport_of`); None for other models. Each stage costs
    what its module charges (`ppx.models.costs.stage_costs_ms`: per stage, or with
    ``model.cost_per=layer`` the sum over its layers), and under ``train.recompute=full`` a
    stage's B, or its I when split, costs its forward more (`ppx.models.costs.with_recompute`)."""
    if cfg.model.kind != "synthetic":
        return None
    from ppx.models.costs import recompute_modes, stage_costs_ms, with_recompute

    fwd, bwd, wgrad = stage_costs_ms(cfg.model, schedule.num_stages, cfg.pipeline.layers_per_stage)
    if schedule.training:  # train.recompute=full: a B (or an I) re-runs its stage's forward first
        bwd = with_recompute(fwd, bwd, recompute_modes(cfg.train.recompute, schedule.num_stages))
    costs = schedules.Costs(fwd=[f / 1e3 for f in fwd], bwd=[b / 1e3 for b in bwd], wgrad=[w / 1e3 for w in wgrad])
    return schedules.simulate(schedule, costs, *transport)


def run_theory(cfg, schedule: Schedule, backend: str) -> Theory:
    from ppx.config import virtual_stages
    from ppx.config.resolve import drain_changed
    from ppx.measure.prediction import transport_of

    t = known_cost_timeline(cfg, schedule, transport_of(cfg, backend))
    if t is not None:
        return Theory(
            t.bubble_fraction(),
            t.makespan,
            "simulated at the known-cost model's per-stage costs with zero communication (exact)",
            tuple(t.idle(r) / t.makespan if t.makespan > 0 else 0.0 for r in range(schedule.num_ranks)),
        )
    fam = schedules.formula_family(cfg.pipeline.schedule)
    if fam is None:
        return Theory(None, None, "none: a schedule from a CSV has no formula")
    if drain_changed(cfg):
        return Theory(None, None, "none: train.split_backward=drain runs whole B's where the family's formula splits")
    return Theory(
        fam.bubble(schedule.num_ranks, schedule.num_microbatches, virtual_stages(cfg)),
        None,
        f"closed form {fam.bubble_formula}, which assumes every stage costs the same",
    )
