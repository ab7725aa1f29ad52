"""`ppx simulate`: a schedule's predicted timeline, step time and bubble from action costs
(given, or measured in a run)."""

from __future__ import annotations

from pathlib import Path

from ppx.commands.common import (
    drain_list,
    first_step_note,
    measured_run,
    ms_list,
    noisy_run_note,
    output_path,
    priced_split_note,
    require_backward,
    schedule_from,
)
from ppx.commands.run_costs import run_costs_at
from ppx.errors import UserError
from ppx.plan.calibrate import runs_whole
from ppx.units import count, stage_list

# the cost flags (ms) and their defaults: a simulation from flags, never beside --from-run's costs
COST_DEFAULTS = {
    "fwd_ms": "10",
    "bwd_ms": "20",
    "wgrad_ms": "0",
    "whole_ms": None,  # a whole B: bwd + wgrad unless given
    "p2p_ms": 0.0,
    "send_post_ms": 0.0,
    "recv_post_ms": 0.0,
}


def cmd_simulate(args) -> int:
    from ppx import schedules

    _check_flags(args)
    run = measured = None
    if args.from_run:
        run, measured = measured_run(args.from_run, backward=False)  # (a forward-only schedule needs none)
        _take_the_runs_shape(args, run, measured)
        for note in (first_step_note(args.from_run, run.config), noisy_run_note(args.from_run, measured.step_times_s)):
            if note:
                print(note)
    sched = schedule_from(args.name, args.stages, args.microbatches, args.virtual, args.transport or "nccl")
    built = sched.actions
    if args.drain:
        sched = drain_list(sched)
    args.drained = sched.actions != built  # (a list drain leaves as built keeps its family's formula)
    if args.drain and not args.drained:
        from ppx.schedules.ir.structure import drain_keeps

        print(f"note: drain leaves this list as built: {drain_keeps(sched)}")
    shape = (sched.num_ranks, sched.stages_per_rank)
    if measured is not None and shape != (measured.world_size, measured.virtual) and not _measured_at(run, sched):
        raise UserError(
            f"{args.from_run} ran {measured.world_size} ranks with {count(measured.virtual, 'stage')} each, {args.name} "
            f"has {sched.num_ranks} with {sched.stages_per_rank}; the run's costs are per stage"
        )
    args.virtual = sched.stages_per_rank
    costs, transport, lookahead, reduce = _costs(args, sched, run, measured)
    transport = args.transport or transport
    lookahead = args.recv_lookahead if args.recv_lookahead is not None else lookahead
    t = schedules.simulate(sched, costs, transport, lookahead, reduce)
    _print_prediction(args, sched, t, reduce, run, measured)
    if args.png:
        _draw(sched, t, args.png)
    return 0


def _check_flags(args) -> None:
    """The cost flags (their defaults filled in unless --from-run, which refuses them) and
    the latencies and lookahead, checked before anything is built."""
    output_path("--png", args.png)
    given = [f"--{k.replace('_', '-')}" for k in COST_DEFAULTS if getattr(args, k) is not None]
    if args.from_run and given:
        raise UserError(f"--from-run takes the run's costs; leave out {', '.join(given)}")
    for k, default in COST_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, default)
    for option, value in (
        ("--p2p-ms", args.p2p_ms),
        ("--send-post-ms", args.send_post_ms),
        ("--recv-post-ms", args.recv_post_ms),
    ):
        if value < 0:
            raise UserError(f"{option} must be >= 0, got {value:g}")
    if args.recv_lookahead is not None and args.recv_lookahead < -1:
        raise UserError(f"--recv-lookahead must be -1 (all at the first wait) or >= 0, got {args.recv_lookahead}")


def _take_the_runs_shape(args, run, measured) -> None:
    """--stages, --microbatches and --virtual from the run where not given (a CSV has its own);
    ranks and stages per rank given otherwise are refused: the run's costs are per stage."""
    from ppx import schedules

    if schedules.is_csv(args.name):
        return
    from ppx.schedules.registry import formula_family

    ran = (measured.world_size, measured.virtual)
    shape = {"stages": measured.world_size, "microbatches": measured.microbatches, "virtual": measured.virtual_stages}
    own = schedules.default_virtual(args.name)
    fam = formula_family(args.name)
    wanted = args.virtual if args.virtual is not None else own  # stages per rank: given, else the family's
    if wanted >= 1 and wanted != measured.virtual and _measured_at(run, ran[0] * wanted):
        # an entry beside the run ran this many stages: its own actions price them (`_costs`)
        if args.stages not in (None, ran[0]):
            raise UserError(
                f"{args.from_run} ran {ran[0]} ranks, and its run.paired entries {count(wanted, 'stage')} a rank "
                f"there: leave out --stages or give {ran[0]}"
            )
        args.stages, args.virtual = ran[0], wanted
        if args.microbatches is None:
            args.microbatches = measured.microbatches
        return
    if fam is not None and not fam.virtual and measured.virtual != own:  # a V: exactly its own count
        raise UserError(
            f"{args.name} places exactly {count(own, 'stage')} on every rank and {args.from_run} ran "
            f"{measured.virtual} a rank; its costs are per stage: run with pipeline.schedule={args.name} and simulate that run"
            + (" (or plan --from-run this one, which regroups its stages)" if _regroupable(run, measured) else "")
            + f", or run it beside that run ('run.paired=[pipeline.schedule={args.name}]') and simulate --from-run that"
        )
    if args.virtual is None and measured.virtual != own:
        print(  # not the schedule's default: say whose count this is
            f"note: {args.name} at {count(measured.virtual, 'stage')} a rank, as {args.from_run} ran (its costs "
            f"are per stage; for {schedules.default_virtual(args.name)}, run with pipeline.virtual_stages="
            f"{schedules.default_virtual(args.name)} and simulate that run)"
        )
    for attr, value in shape.items():
        if getattr(args, attr) is None:
            setattr(args, attr, value)
    if (args.stages, args.virtual or 1) != ran:
        raise UserError(
            f"{args.from_run} ran {ran[0]} ranks with {count(ran[1], 'stage')} each; its costs are per "
            "stage, so leave out --stages/--virtual or give the same"
        )


def _measured_at(run, sched_or_stages):
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


def _as_run_costs(own, at):
    """``own`` (`run_costs`) with the actions of ``at`` (a `MeasuredAt`) as its whole costs: its
    stages without an I ran whole; with one and no B, a B costs I + W."""
    from dataclasses import replace
    from statistics import fmean

    a = at.action_s
    return replace(
        own,
        measured_costs={**own.measured_costs, "action_s": {k: fmean(v) for k, v in a.items() if v}},
        cost_samples={**own.cost_samples, "action_s": a},
        whole_stages=tuple(st for st in range(at.stages) if f"{st}I" not in a),
        split_only=tuple(st for st in range(at.stages) if f"{st}I" in a and f"{st}B" not in a),
        lent=(),
        at_stages=(),
        other_way=(),
        input_share=None,
    )


def _regroupable(run, measured) -> bool:
    """Whether a plan from ``run`` can regroup its stages for any schedule: every stage's I and
    W measured apart (a run that never split, or ran a stage whole, leaves them unknown)."""
    costs = run_costs_at(str(run.path))
    return bool(costs.ops() & {"I", "W"}) and not costs.whole_stages


def _costs(args, sched, run, measured) -> tuple:
    """(costs, transport, receive lookahead, data-parallel reduction): the flags' (NCCL, at
    zero lookahead), or the run's measured costs under its own transport."""
    from ppx import schedules
    from ppx.measure.prediction import costs_from, transport_of

    if measured is None:
        from ppx.schedules.ir.structure import whole_stages_of

        n = sched.num_stages
        bwd, wgrad = ms_list("--bwd-ms", args.bwd_ms, n), ms_list("--wgrad-ms", args.wgrad_ms, n)
        whole = None if args.whole_ms is None else ms_list("--whole-ms", args.whole_ms, n)
        if whole is not None:  # a stage ppx's runtime runs whole (ZB-H1's first): its I a whole B, its W nothing
            for s in whole_stages_of(sched):
                bwd[s], wgrad[s] = whole[s], 0.0
        costs = schedules.Costs(
            fwd=ms_list("--fwd-ms", args.fwd_ms, n),
            bwd=bwd,
            wgrad=wgrad,
            whole=whole,
            p2p=args.p2p_ms / 1e3,
            send_post=args.send_post_ms / 1e3,
            recv_post=args.recv_post_ms / 1e3,
        )
        return costs, "nccl", 0, False
    if sched.training:
        require_backward(args.from_run, measured)
    own = run_costs_at(str(run.path))  # the run's, and what its run.paired entries ran that it did not
    at = _measured_at(run, sched)
    if at is not None:  # another stage count than the run's: what its entries ran at this one
        own = _as_run_costs(own, at)
        print(
            f"note: {sched.num_stages} stages from what {', '.join(map(repr, at.sources))} ran beside "
            f"{args.from_run} (its own run has {measured.stages or measured.world_size})"
        )
    try:
        _split_known(args.from_run, own, sched, list(own.whole_stages), run.config)
    except UserError:
        if at is None:
            raise
        raise UserError(  # (a run at the run's own count cannot measure these stages)
            f"what {', '.join(map(repr, at.sources))} ran beside {args.from_run} at {sched.num_stages} stages has "
            f"no I and W apart where {sched.name} splits them: run it beside that run "
            f"('run.paired=[\"{_entry_of(args, sched)}\"]') and simulate --from-run that run"
        ) from None
    backend = (run.env or {}).get("backend", "gloo")
    transport, lookahead = transport_of(run.config, backend)
    reduce = run.config.parallel.data > 1  # its replicas' gradient reductions, at their measured cost
    costs = costs_from(own.measured_costs, sched.num_stages)
    if runs_whole(run.config):  # (the list's stages that ppx's runtime runs whole, as ppx run would)
        from ppx.schedules.ir.structure import whole_stages_of

        costs = costs.run_whole(whole_stages_of(sched), sched.num_stages)
    if own.note(args.from_run):
        print(own.note(args.from_run))
    _note_unmeasured_bs(args, sched, run, own, at)
    return costs, transport, lookahead, reduce


def _entry_of(args, sched, whole: bool = False) -> str:
    """The ``run.paired`` entry that runs ``sched``'s family (``whole``: interleaved 1F1B) at
    its stages per rank beside the run."""
    from ppx import schedules

    name = "interleaved_1f1b" if whole else args.name
    v = sched.stages_per_rank
    return f"pipeline.schedule={name}" + (
        "" if v == schedules.default_virtual(name) else f" pipeline.virtual_stages={v}"
    )


def _note_unmeasured_bs(args, sched, run, own, at=None) -> None:
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
        f"'run.paired=[\"{_entry_of(args, sched, whole=True)}\"]' measures them"
    )


def _print_prediction(args, sched, t, reduce: bool, run, measured) -> None:
    """The predicted step, each rank's split of it, the theory and (--from-run) the run's own."""
    from ppx import schedules

    p, m = sched.num_ranks, sched.num_microbatches
    print(f"{sched.name}: {p} ranks, {sched.num_stages} stages, {m} microbatches")
    basis = "" if measured is None else ", from the run's mean action costs"
    print(f"predicted step time {t.makespan * 1e3:.2f} ms, bubble {t.bubble_fraction():.1%} (idle / step time{basis})")
    print(
        f"steady-state step {t.steady() * 1e3:.2f} ms (the longest rank's own span: consecutive steps with no rank "
        "waiting at a step boundary; the step above is synchronous, every rank starting together, as ppx run measures)"
    )
    for r in range(p):
        print(
            f"  rank {r}: compute {t.compute[r] * 1e3:.2f} ms, comm {t.comm[r] * 1e3:.2f} ms"
            + (f", data-parallel reduction {t.dp_comm[r] * 1e3:.2f} ms" if reduce else "")
            + f", idle {t.idle(r) * 1e3:.2f} ms"
        )
    fam = schedules.FAMILIES.get(sched.name)
    if fam is not None and not args.drained:  # (a list drain changed is not the family's: no formula)
        print(f"theory ({fam.bubble_formula}): {fam.bubble(p, m, args.virtual):.1%}")
    if measured is None:
        return
    step = measured.step_time_of_costs_s  # over the steps the costs come from, as the run's own report
    bubble = float("nan") if measured.bubble_of_costs is None else measured.bubble_of_costs
    if _ran(run, sched):
        print(
            f"measured in {args.from_run}: step {step * 1e3:.2f} ms ({step / t.makespan - 1:+.1%} against the "
            f"prediction), bubble {bubble:.1%}"
        )
        drawn = (run.raw_summary.get("predicted") or {}).get("step_time_s")
        if drawn:  # what ppx run said: the expected step over draws of the samples, longer than the means'
            print(
                f"  (ppx run's own prediction draws each action's cost from its samples: step {drawn * 1e3:.2f} ms; "
                "a slow draw on the critical path costs all its delay, so the means' step comes out shorter)"
            )
    else:  # what-if: the run's costs under another order; its own step is not this one's
        print(
            f"measured in {args.from_run} ({measured.schedule} at m={measured.microbatches}, another order than "
            f"this one's): step {step * 1e3:.2f} ms, bubble {bubble:.1%}"
        )
        entry, row = _beside_as(run, sched)
        if row:
            step = row["median_step_s"]
            print(
                f"  beside it, {entry!r} ran this list: step {step * 1e3:.2f} ms (median of {row['pairs']} pairs, "
                f"{step / t.makespan - 1:+.1%} against the prediction)"
            )


def _beside_as(run, sched) -> tuple[str | None, dict | None]:
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


def _draw(sched, t, png: str) -> None:
    """The predicted step as a Gantt picture at ``png``."""
    from ppx.measure.spans import Span
    from ppx.report.gantt import draw_step

    spans = {
        r: [Span("compute", str(e.action), (e.action,), e.start, e.end) for e in row] for r, row in enumerate(t.events)
    }
    p, m = sched.num_ranks, sched.num_microbatches
    draw_step(
        spans,
        Path(png),
        f"{sched.name} p={p} m={m}: predicted {t.makespan * 1e3:.1f} ms, bubble {t.bubble_fraction():.1%}",
        sched.stage_to_rank,
        xlabel="predicted time in the step (ms)",
    )
    print(f"wrote {png}")


def _ran(run, sched) -> bool:
    """Whether ``run`` ran ``sched``'s compute order (its schedule as its config resolves it;
    where that cannot be rebuilt, a CSV moved, by name and microbatches)."""
    from ppx import schedules
    from ppx.config import resolve_schedule

    try:
        ran = resolve_schedule(run.config)
    except (UserError, OSError, ValueError):  # ScheduleError is a UserError
        name = run.summary.schedule
        name = Path(name).stem if schedules.is_csv(name) else name  # a CSV's schedule is named by its file
        return name == sched.name and run.summary.microbatches == sched.num_microbatches
    return ran.compute_only().actions == sched.compute_only().actions


def _split_known(path: str, costs, sched, whole: list[int], cfg) -> None:
    """Fail where ``sched`` splits a backward that the run ``path`` never split, or ran whole
    (``whole``: its stages whose I took the whole backward) where ``sched`` would not: their I
    and W costs are unknown, not B and 0 (as `ppx plan --from-run` refuses those candidates)."""
    from ppx.plan.calibrate import split_command
    from ppx.schedules.ir.action import Op
    from ppx.schedules.ir.structure import split_apart

    splits = any(a.op is Op.W for row in sched.actions for a in row)
    why = None
    if splits and not costs.ops() & {"I", "W"}:
        why = "never split its backward"
    elif apart := split_apart(sched, whole):
        why = f"ran {stage_list(apart)} whole (each I followed at once by its W), which {sched.name} splits"
    if why:
        raise UserError(
            f"{path} {why}, so its I and W costs are unknown; measure them with "
            f"`{split_command(path + '/config.yaml', cfg)}` and simulate "
            "--from-run that run"
        )
