"""What `ppx simulate --from-run` reads from a run: its measured costs (and its run.paired
entries', at its stage count or another), what a list needs that the run did not measure, and
whether the run, or an entry beside it, ran the simulated list."""

from __future__ import annotations

from pathlib import Path

from ppx.commands.common import priced_split_note, require_backward
from ppx.commands.run_costs import run_costs_at
from ppx.errors import UserError
from ppx.plan.calibrate import runs_whole
from ppx.units import stage_list


def costs_of_run(args, sched, run, measured) -> tuple:
    """(costs, transport, receive lookahead, data-parallel reduction) of ``sched`` from the run's
    measured costs, under its own transport, with the notes on what priced them."""
    from ppx.measure.prediction import costs_from, transport_of

    if sched.training:
        require_backward(args.from_run, measured)
    own = run_costs_at(str(run.path))  # the run's, and what its run.paired entries ran that it did not
    at = measured_at(run, sched)
    if at is not None:  # another stage count than the run's: what its entries ran at this one
        own = as_run_costs(own, at)
        print(
            f"note: {sched.num_stages} stages from what {', '.join(map(repr, at.sources))} ran beside "
            f"{args.from_run} (its own run has {measured.stages or measured.world_size})"
        )
    try:
        split_known(args.from_run, own, sched, list(own.whole_stages), run.config)
    except UserError:
        if at is None:
            raise
        raise UserError(  # (a run at the run's own count cannot measure these stages)
            f"what {', '.join(map(repr, at.sources))} ran beside {args.from_run} at {sched.num_stages} stages has "
            f"no I and W apart where {sched.name} splits them: run it beside that run "
            f"('run.paired=[\"{entry_of(args, sched)}\"]') and simulate --from-run that run"
        ) from None
    backend = (run.env or {}).get("backend", "gloo")
    transport, lookahead = transport_of(run.config, backend)
    reduce = run.config.parallel.data > 1  # its replicas' gradient reductions, at their measured cost
    costs = costs_from(own.measured_costs, sched.num_stages)
    whole: set[int] = set()
    if runs_whole(run.config):  # (the list's stages that ppx's runtime runs whole, as ppx run would)
        from ppx.schedules.ir.structure import whole_stages_of

        whole = whole_stages_of(sched)
        # (a stage the run ran whole too measured its whole backward in the I, nothing in the W:
        # its means stand as they are, as the run's own prediction takes them)
        costs = costs.run_whole(whole - set(own.whole_stages), sched.num_stages)
    note = own.used_by(sched, whole).note(args.from_run)
    if note:
        print(note)
    note_unmeasured_bs(args, sched, run, own, at)
    return costs, transport, lookahead, reduce


def measured_at(run, sched_or_stages):
    """What ``run``'s entries measured at the stage count of ``sched_or_stages`` (a schedule or
    a count), where it differs from the run's and their stages held the units a run of that
    count holds (`ppx.commands.run_costs`, ``at_stages``), or None."""
    from ppx import models

    n = sched_or_stages if isinstance(sched_or_stages, int) else sched_or_stages.num_stages
    if n < 1 or n == (run.summary.stages or run.summary.world_size):
        return None
    try:
        units = tuple(len(r) for r in models.split_of(run.config, n))
    except (UserError, ValueError):
        return None
    return next((a for a in run_costs_at(str(run.path)).at_stages if a.stages == n and a.units == units), None)


def as_run_costs(own, at):
    """``own`` (`run_costs`) with the actions of ``at`` (a `MeasuredAt`) as its whole costs: its
    stages without an I ran whole; with one and no B, a B costs I + W."""
    from dataclasses import replace
    from statistics import fmean

    from ppx.schedules.sim.costs import with_actions

    a = at.action_s
    return replace(
        own,
        measured_costs={**own.measured_costs, "action_s": {k: fmean(v) for k, v in a.items() if v}},
        cost_samples=with_actions(own.cost_samples, a),
        whole_stages=tuple(st for st in range(at.stages) if f"{st}I" not in a),
        split_only=tuple(st for st in range(at.stages) if f"{st}I" in a and f"{st}B" not in a),
        lent=(),
        at_stages=(),
        other_way=(),
        input_share=None,
        forward_shift=(),  # (the run's stages' lending: these are the entries' own)
    )


def regroupable(run, measured) -> bool:
    """Whether a plan from ``run`` can regroup its stages for any schedule: every stage's I and
    W measured apart (a run that never split, or ran a stage whole, leaves them unknown)."""
    costs = run_costs_at(str(run.path))
    return bool(costs.ops() & {"I", "W"}) and not costs.whole_stages


def entry_of(args, sched, whole: bool = False) -> str:
    """The ``run.paired`` entry that runs ``sched``'s family (``whole``: interleaved 1F1B) at
    its stages per rank beside the run."""
    from ppx import schedules

    name = "interleaved_1f1b" if whole else args.name
    v = sched.stages_per_rank
    return f"pipeline.schedule={name}" + (
        "" if v == schedules.default_virtual(name) else f" pipeline.virtual_stages={v}"
    )


def note_unmeasured_bs(args, sched, run, own, at=None) -> None:
    """Where the list runs a B on a stage whose every backward the run split, and nothing
    beside it ran one whole (``own``: `run_costs`; ``at``: the entries' at another stage
    count, whose stages these are): those B's cost the run's I + W, the split's own cost
    included (under --drain, so what drain saves cannot show)."""
    from ppx.schedules.ir.action import Op

    blind = sorted({a.stage for row in sched.actions for a in row if a.op is Op.B} & set(own.split_only))
    if not blind:
        return
    what = "drain's B's" if args.drain else f"{sched.name}'s B's"
    so = ", so what drain saves cannot show" if args.drain else ""
    if at is None:
        print(priced_split_note(args.from_run, blind, what, run.config, so))
        return
    print(
        f"note: {what} on {stage_list(blind)} cost the I + W that {', '.join(map(repr, at.sources))} ran there beside "
        f"{args.from_run} (none ran a whole B at {sched.num_stages} stages){so}; one run beside it as "
        f"'run.paired=[\"{entry_of(args, sched, whole=True)}\"]' measures them"
    )


def beside_as(run, sched) -> tuple[str | None, dict | None]:
    """The ``run.paired`` entry of ``run`` that ran ``sched``'s compute order on its ranks, and
    its summary row, or (None, None)."""
    from omegaconf.errors import OmegaConfBaseException

    from ppx.config import resolve_schedule
    from ppx.config.paired import entry_config
    from ppx.schedules.ir.structure import same_compute

    for entry, row in (run.raw_summary.get("paired") or {}).items():
        try:
            ran = resolve_schedule(entry_config(run.config, entry))
        except (UserError, OmegaConfBaseException, OSError, ValueError):
            continue
        if same_compute(ran, sched) and (row or {}).get("median_step_s"):
            return entry, row
    return None, None


def ran_this(run, sched) -> bool:
    """Whether ``run`` ran ``sched``'s compute order (its schedule as its config resolves it;
    where that cannot be rebuilt, a CSV moved, by name and microbatches)."""
    from ppx import schedules
    from ppx.config import resolve_schedule
    from ppx.schedules.ir.structure import same_compute

    try:
        ran = resolve_schedule(run.config)
    except (UserError, OSError, ValueError):  # ScheduleError is a UserError
        name = run.summary.schedule
        name = Path(name).stem if schedules.is_csv(name) else name  # a CSV's schedule is named by its file
        return name == sched.name and run.summary.microbatches == sched.num_microbatches
    return same_compute(ran, sched)


def split_known(path: str, costs, sched, whole: list[int], cfg) -> None:
    """Fail where ``sched`` splits a backward that the run ``path`` never split, or ran whole
    (``whole``: its stages whose I took the whole backward) where ``sched`` would not: their I
    and W costs are unknown, not B and 0 (as `ppx plan --from-run` refuses those candidates)."""
    from ppx.plan.calibrate import measuring_command
    from ppx.schedules.ir.action import Op
    from ppx.schedules.ir.structure import split_apart

    splits = any(a.op is Op.W for row in sched.actions for a in row)
    why, apart = None, []
    if splits and not costs.ops() & {"I", "W"}:
        why = "never split its backward"
    elif apart := split_apart(sched, whole):
        why = f"ran {stage_list(apart)} whole (each I followed at once by its W), which {sched.name} splits"
    if why:
        raise UserError(
            f"{path} {why}, so its I and W costs are unknown; measure them with "
            f"`{measuring_command(path, cfg, apart)}` and simulate --from-run that run"
        )
