"""`ppx simulate`: a schedule's predicted timeline, step time and bubble from action costs
(given, or measured in a run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ppx.commands.common import (
    drain_list,
    first_step_note,
    measured_run,
    ms_list,
    noisy_run_note,
    output_path,
    schedule_from,
)
from ppx.commands.simulate_run import beside_as, costs_of_run, measured_at, ran_this, regroupable
from ppx.errors import UserError
from ppx.units import count

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
        sched = drain_list(sched, args.transport or "nccl")
    args.drained = sched.actions != built  # (a list drain leaves as built keeps its family's formula)
    if args.drain and not args.drained:
        from ppx.schedules.ir.structure import drain_keeps

        print(f"note: drain leaves this list as built: {drain_keeps(sched)}")
    shape = (sched.num_ranks, sched.stages_per_rank)
    if measured is not None and shape != (measured.world_size, measured.virtual) and not measured_at(run, sched):
        raise UserError(
            f"{args.from_run} ran {measured.world_size} ranks with {count(measured.virtual, 'stage')} each, {args.name} "
            f"has {sched.num_ranks} with {sched.stages_per_rank}; the run's costs are per stage"
        )
    args.virtual = sched.stages_per_rank
    costs, transport, lookahead, reduce = _costs(args, sched, run, measured)
    transport = args.transport or transport
    if args.recv_lookahead and transport == "nccl":  # (from a run: its transport, known only now)
        _no_lookahead(args, f"{args.from_run} ran on nccl")
    lookahead = args.recv_lookahead if args.recv_lookahead is not None else lookahead
    t = schedules.simulate(sched, costs, transport, lookahead, reduce)
    _print_prediction(args, sched, t, reduce, run, measured, (costs, transport, lookahead))
    if args.png:
        _draw(sched, t, args.png)
    return 0


def _check_flags(args) -> None:
    """The cost flags (their defaults filled in unless --from-run, which refuses them) and
    the latencies and lookahead, checked before anything is built."""
    output_path("--png", args.png, picture=True)
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
    if args.recv_lookahead and (args.transport or ("nccl" if not args.from_run else None)) == "nccl":
        _no_lookahead(args, "--transport nccl" if args.transport else "the default --transport nccl")


def _no_lookahead(args, nccl: str) -> None:
    """Fail on a --recv-lookahead under NCCL, which posts each receive in order (the simulator
    took none there: it was silently ignored)."""
    raise UserError(
        f"--recv-lookahead {args.recv_lookahead} is gloo's (receives posted early); under nccl ({nccl}) each receive "
        "is posted in order, right before its use: leave it out, or give --transport gloo"
    )


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
    if wanted >= 1 and wanted != measured.virtual and measured_at(run, ran[0] * wanted):
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
            + (" (or plan --from-run this one, which regroups its stages)" if regroupable(run, measured) else "")
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
            f"{args.from_run} ran {count(ran[0], 'rank')} with {count(ran[1], 'stage')} each; its costs are per "
            "stage, so leave out --stages/--virtual or give the same"
            + (
                f" (ppx plan --from-run {args.from_run} --stages {args.stages} regroups them)"
                if args.stages != ran[0] and _plan_regroups(args, run, measured)
                else ""
            )
        )


def _plan_regroups(args, run, measured) -> bool:
    """Whether `ppx plan --from-run` prices ``args.name`` at ``args.stages`` ranks by regrouping
    the run's stages: not where the run fixed its layers per stage, nor where the list splits a
    backward the run left unmeasured (no I and W apart, or a stage run whole)."""
    from ppx import schedules
    from ppx.schedules.ir.structure import split_stages

    if run.config.pipeline.layers_per_stage or not args.stages:
        return False
    if regroupable(run, measured):
        return True
    try:
        m = args.microbatches or measured.microbatches
        return not split_stages(schedules.build(args.name, args.stages, m, args.virtual))
    except Exception:  # (a shape the family refuses: no hint)
        return False


def _costs(args, sched, run, measured) -> tuple:
    """(costs, transport, receive lookahead, data-parallel reduction): the flags' (NCCL, at
    zero lookahead), or the run's measured costs under its own transport."""
    from ppx import schedules

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
    return costs_of_run(args, sched, run, measured)


def _zero_communication(sched, costs, transport: str, lookahead: int) -> float:
    """The bubble of ``sched`` at ``costs`` with no hand-off, posting or overhead cost: known
    costs' theory, as `ppx run` gives a known-cost run's."""
    from ppx import schedules

    free = dataclasses.replace(costs, p2p=0.0, send_post=0.0, recv_post=0.0, overhead=0.0)
    return schedules.simulate(sched, free, transport, lookahead).bubble_fraction()


def _print_prediction(args, sched, t, reduce: bool, run, measured, simulated: tuple) -> None:
    """The predicted step, each rank's split of it, the theory and (--from-run) the run's own."""
    from ppx import schedules

    p, m = sched.num_ranks, sched.num_microbatches
    print(f"{sched.name}: {p} ranks, {sched.num_stages} stages, {m} microbatches")
    basis = "" if measured is None else ", from the run's mean action costs"
    print(
        f"predicted step time {t.makespan * 1e3:.2f} ms, bubble {_share(t.bubble_fraction())} (idle / step time{basis})"
    )
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
    fam = schedules.formula_family(args.name)  # (a CSV has none, whatever its file is called)
    exact = measured is not None and run.config.model.kind == "synthetic" and ran_this(run, sched)
    if exact and measured.bubble_fraction_theory is not None:  # (ppx run's, its own list at its stages' costs)
        print(f"theory (the known-cost model's, each stage at its own costs): {measured.bubble_fraction_theory:.1%}")
    elif fam is not None and not args.drained:  # (a list drain changed is not the family's: no formula)
        closed = fam.bubble(p, m, args.virtual)
        exact = None if measured is not None else _zero_communication(sched, *simulated)  # (the flags' costs)
        if exact is None or abs(exact - closed) < 5e-4:
            print(f"theory ({fam.bubble_formula}): {closed:.1%}")
        else:  # unequal stages, or W apart from what the formula assumes: the formula is not these costs'
            print(
                f"theory (this list at these costs, zero communication): {_share(exact)} (the closed form "
                f"{fam.bubble_formula} says {closed:.1%}, at the equal costs it assumes)"
            )
    if measured is None:
        return
    step = measured.step_time_of_costs_s  # over the steps the costs come from, as the run's own report
    bubble = float("nan") if measured.bubble_of_costs is None else measured.bubble_of_costs
    if ran_this(run, sched):
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
        entry, row = beside_as(run, sched)
        if row:
            step = row["median_step_s"]
            print(
                f"  beside it, {entry!r} ran this list: step {step * 1e3:.2f} ms (median of {row['pairs']} pairs, "
                f"{step / t.makespan - 1:+.1%} against the prediction)"
            )


def _share(x: float) -> str:
    """A simulated share in percent, its float noise rounded off first: costs in ms made
    seconds simulate 1/16 as 0.06250000000000003, which printed 6.3% beside theory's 6.2%."""
    return f"{round(x, 9):.1%}"


def _draw(sched, t, png: str) -> None:
    """The predicted step as a Gantt picture at ``png``."""
    from ppx.measure.spans import Span
    from ppx.report.gantt import draw_step

    spans = {
        r: [Span("compute", str(e.action), (e.action,), e.start, e.end) for e in row] for r, row in enumerate(t.events)
    }
    p, m = sched.num_ranks, sched.num_microbatches
    # the simulator keeps each rank's communication as a sum, not as spans: the white between
    # computes is communication and idle, each rank's sums under its name, as the text gives them
    dp = (lambda r: f", dp {t.dp_comm[r] * 1e3:.2f}") if t.dp_comm else (lambda r: "")
    notes = {r: f"comm {t.comm[r] * 1e3:.2f}{dp(r)}, idle {t.idle(r) * 1e3:.2f} ms" for r in range(p)}
    draw_step(
        spans,
        Path(png),
        f"{sched.name} p={p} m={m}: predicted {t.makespan * 1e3:.2f} ms, bubble {_share(t.bubble_fraction())}",
        sched.stage_to_rank,
        xlabel="predicted time in the step (ms)",
        gaps="communication or idle (their sums under each rank)",
        rank_notes=notes,
    )
    print(f"wrote {png}")
