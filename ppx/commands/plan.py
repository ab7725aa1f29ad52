"""`ppx plan`: every candidate schedule x p x m x v predicted on the given or measured costs,
ranked by throughput among those that fit the memory budget; the table printed, and
plan.md, plan.json, plan.png and best.csv written."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ppx.commands.common import empty_or_new, first_step_note, noisy_run_note, not_in_a_run
from ppx.commands.plan_inputs import budget, calibrated, from_flags, from_run, ints
from ppx.errors import UserError
from ppx.plan.space import SPLIT_REASON, schedule_names
from ppx.units import count


def out_dir(text: str | None) -> Path:
    """--out, or plans/<UTC time>; an existing non-empty folder (or a link to nothing) is refused."""
    if text is not None and not text.strip():
        raise UserError("--out is empty: give a folder's path (or leave --out out: plans/<UTC time>)")
    out = Path(text) if text else Path("plans") / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    empty_or_new("--out", out)
    not_in_a_run("--out", out)
    return out


def _names(results, most: int = 4) -> str:
    """Up to ``most`` labels, then how many more."""
    shown = ", ".join(r.label() for r in results[:most])
    return shown + (f" and {len(results) - most} more" if len(results) > most else "")


MEASURED = 3  # candidates a from-run plan's measuring command holds at least (a prediction from one run
# moves by 2-3% from run to run: its second and third are worth measuring beside its best)


def candidate_overrides(results, out: Path, inputs, run_cfg, best) -> list[list[str]]:
    """Per candidate, the `ppx run` overrides that run it as planned: a family by name (the plan
    built it as `ppx run` does); the automatic schedule and a family's drained list (``+drain``)
    from a CSV of their own in ``out`` (the best's: best.csv), no name of ppx's."""
    from ppx.plan import outputs
    from ppx.plan.builders import AUTO, DRAIN
    from ppx.plan.howto import planned_overrides

    lists = []
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        schedule = r.schedule
        if r.schedule == AUTO or r.schedule.endswith(DRAIN):
            shape = f"_p{r.p}_m{r.m}" + (f"_v{r.v}" if r.v != 1 else "")
            schedule = out / ("best.csv" if r is best else r.schedule.replace("+", "_") + shape + ".csv")
            if r is not best:
                outputs.write_best(schedule, r, inputs)
        lists.append(planned_overrides(r, schedule, inputs, run_cfg))
    return lists


def config_of(run_dir: str):
    """The config a run directory ran with."""
    from ppx.report.run_dir import RunDir

    return RunDir(run_dir).config


def assumption_notes(args, inputs, skipped, p: int, run_cfg=None) -> list[str]:
    """What a plan from flags assumed for the runtime's time per action and the hand-off, and
    where this machine's figures come from (at the plan's largest ``p``); a run's split
    candidates it refused, and why."""
    from ppx.commands.common import whole_stages
    from ppx.plan.calibrate import calibration_hint, refused_split_note
    from ppx.report.run_dir import RunDir

    out = []
    if not args.from_run:
        measured = inputs.source != "flags"  # this machine's figures: --machine-from, --calibrate or kept
        out.append(
            f"note: assumed {inputs.overhead_s * 1e3:.4g} ms of runtime overhead per action and "
            f"{inputs.p2p_s * 1e3:.4g} ms per hand-off ({inputs.source.removeprefix('flags; ')})"
            + ("" if measured else "; " + calibration_hint(p))
        )
    if args.from_run:  # (``run_cfg``: the run's config)
        out.append(first_step_note(args.from_run, run_cfg))
        run = RunDir(args.from_run)  # (read once for the notes below)
        out.append(noisy_run_note(args.from_run, run.summary.step_times_s or []))
        out.append(lent_note(args.from_run))
        if run.raw_summary.get("world_size") == 1 and p > 1:  # (p: the plan's largest)
            out.append(
                f"note: {args.from_run} ran one rank, so it measured no hand-off between ranks: the candidates at "
                f"p > 1 hand each tensor over in {inputs.p2p_s * 1e3:.4g} ms"
                + (" (--p2p-ms)" if args.p2p_ms is not None else "; give the link's latency with --p2p-ms")
            )
        ran = tuple(whole_stages(run))  # (those the run itself ran whole)
        out.append(refused_split_note(args.from_run, skipped, inputs.whole_stages, run_cfg, ran))
        if run_cfg.train.split_backward == "drain" and inputs.whole_s is not None:
            out.append(
                f"note: {args.from_run} ran train.split_backward=drain: each schedule that splits its backward is "
                "planned as its family's list (every backward split, at the I and W of the microbatches the run "
                "split) and as drain runs it (<name>+drain: B's at the B's the run ran whole); the commands run "
                "the list as planned (its CSV, train.split_backward=auto)"
            )
    return [n for n in out if n]


def lent_note(from_run: str) -> str | None:
    """What the plan's costs took from the run's ``run.paired`` entries (`run_costs`), or None."""
    from ppx.commands.run_costs import run_costs_at

    return run_costs_at(str(from_run)).note(from_run)


def regrouped_note(from_run: str, shown, inputs, cfg=None) -> str | None:
    """The note where candidates among those shown (``shown``) run more stages than the run
    measured and no entry measured at their stage count (`timed_at_its_count`): each of their
    stages is priced at its units' share of a run stage's time, so what a stage costs per call
    besides its layers' work is not counted again for the extra stages, and they can run slower
    than planned; with the run beside them (`stage_count_command`, from the run's config ``cfg``)
    a plan prices them as they ran."""
    from ppx.plan.calibrate import stage_count_command
    from ppx.plan.space import timed_at_its_count

    more = [
        r
        for r in shown
        if inputs.stages and r.p * r.v > inputs.stages and not timed_at_its_count(r.schedule, r.p, r.m, r.v, inputs)
    ]
    if not more:
        return None
    p = cfg.pipeline.stages if cfg else None  # (entries beside a run share its ranks: its p only)
    ours = [(r.schedule, r.v) for r in more if r.p == p]
    beside = stage_count_command(from_run + "/config.yaml", cfg, ours) if ours else None
    how = f"; to plan them as they run, plan --from-run a run of them beside it: `{beside}`" if beside else ""
    if p is not None and any(r.p != p for r in more):
        how += f"; those at another p than the run's {p} only a run at that p measures"
    best = f"; the best, {shown[0].label()}, is one of them: its place is the regrouping's" if shown[0] in more else ""
    return (
        f"note: {', '.join(sorted({r.label() for r in more}))} run more stages than the {inputs.stages} {from_run} "
        "measured: each of their stages is priced at its layers' share of a measured stage's time, and what a stage "
        "costs per call besides its layers' work is not counted again, so they can run slower than planned (on CPU, "
        "p=2, against 1F1B's step: ZB-V on llama-tiny predicted 0.97-1.00x, measured 1.04-1.06x; interleaved_1f1b v=2 "
        f"on the transformer predicted 0.98x, measured 1.06x){best}; measure them before choosing{how}"
    )


def priced_split_note_of(from_run: str, results, inputs) -> str | None:
    """The note where candidates run whole backwards (B's) that the plan prices at the run's I
    + W, on the stages the run split on every microbatch (`split_only_stages`): they may plan
    slower than they run. A candidate of other stages than the run's shares its costs out, so
    any B of its counts."""
    from ppx.commands.common import priced_split_note
    from ppx.commands.run_costs import run_costs_at
    from ppx.plan.builders import AUTO, build
    from ppx.report.run_dir import RunDir
    from ppx.schedules.ir.action import Op

    run = RunDir(from_run)
    blind = set(run_costs_at(str(from_run)).split_only)
    if not blind:
        return None
    names: list[str] = []
    for r in results:
        if r.schedule == AUTO or r.schedule in names:  # (zb_auto runs a B only where W costs nothing)
            continue
        own = r.p * r.v == inputs.stages
        if any(
            a.op is Op.B and (a.stage in blind or not own)
            for row in build(r.schedule, r.p, r.m, r.v, inputs).actions
            for a in row
        ):
            names.append(r.schedule)
    if not names:
        return None
    return priced_split_note(from_run, sorted(blind), "the B's of " + ", ".join(sorted(names)), run.config)


def _reasons(skipped) -> str:
    """Why the first three skipped shapes were skipped, each reason once (with every schedule
    it held for)."""
    by_reason: dict[str, list[str]] = {}
    for s in skipped:
        names = by_reason.setdefault(s.reason, [])
        if s.schedule not in names:
            names.append(s.schedule)
    return "; ".join(f"{', '.join(names)}: {reason}" for reason, names in list(by_reason.items())[:3])


LONG_PLAN = 2**20  # stage-microbatches in all (each candidate's p x v x m), past which a plan says what it does
# as it goes: 30 to 60 s of one process (1F1B p=64 m=2048's 131072 took 3.5 s, ZB-V's take twice 1F1B's)


def _progress(cands, jobs: int | None, start: float):
    """For a plan of more than ``LONG_PLAN`` stage-microbatches, a line on stderr saying so (it
    printed nothing for minutes), and a function to call with each candidate evaluated that
    says each tenth of the work done; None (nothing said) for others."""
    from ppx.plan.search import default_jobs

    work = [c.p * c.v * c.m for c in cands]
    total = sum(work)
    if total <= LONG_PLAN:
        return None
    n = jobs or default_jobs()
    procs = f"{n} process" + ("es" if n != 1 else "")
    print(
        f"ppx plan: {len(cands)} candidates of {total} stage-microbatches in all (p x v x m each) to build and simulate "
        f"over {procs}: this takes a while (fewer or smaller --stages, --microbatches or --schedules take less); "
        "progress every tenth",
        file=sys.stderr,
        flush=True,
    )
    place = {c: k for k, c in enumerate(cands)}
    said = [0, 0]  # (work done, tenths said)

    def done(c) -> None:
        said[0] += work[place[c]]
        tenth = said[0] * 10 // total
        if said[1] < tenth < 10:
            said[1] = tenth
            print(
                f"ppx plan: {tenth * 10}% of the work done ({place[c] + 1} of {len(cands)} candidates) in "
                f"{time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    return done


def _check(args) -> None:
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    from ppx.plan.search import usable_cpus

    cpus = usable_cpus()
    if args.jobs is not None and args.jobs > cpus:  # (each job a process: thousands would swamp the machine)
        raise UserError(f"--jobs {args.jobs}: this process may use {count(cpus, 'CPU')}; give at most {cpus}")
    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    if not args.close_pct >= 0:
        raise UserError(f"--close-pct must be >= 0, got {args.close_pct:g}")
    budget(args)  # (refused before a run is read: its model weighed on fake tensors takes seconds)


def cmd_plan(args) -> int:
    from ppx.plan import outputs, pareto, table
    from ppx.plan.howto import EXPERIMENT, check, command, full_command, run_command
    from ppx.plan.scale import cluster_note
    from ppx.plan.search import near_best, search
    from ppx.plan.space import candidates
    from ppx.units import format_bytes

    _check(args)
    names = schedule_names(args.schedules)
    vs = ints("--virtual", args.virtual) or [2, 3, 4]
    if args.from_run:
        inputs, ps, ms, experiment = from_run(args)
    else:
        inputs, ps, ms = from_flags(args)
        experiment = EXPERIMENT
    if inputs.budget_bytes is not None and not (inputs.act_bytes or inputs.param_bytes):
        how = (
            f"{args.from_run} has no saved bytes per stage (run it with instrument.memory on); or give --param-bytes"
            if args.from_run
            else "give --act-bytes (what one microbatch's forward saves) and --param-bytes, or --from-run a run"
        )
        raise UserError(f"--mem-budget {args.mem_budget}: nothing to hold against it; {how}")
    out = out_dir(args.out)
    cands, skipped = candidates(names, ps, ms, vs, inputs)  # shapes only: before any calibration runs
    if not cands:
        raise UserError("no candidate to plan: " + _reasons(skipped))
    unread = None
    if not args.from_run:
        inputs, unread = calibrated(args, inputs, ps)
    start = time.perf_counter()
    results, refused = search(cands, inputs, args.jobs, _progress(cands, args.jobs, start))
    skipped += refused
    took = time.perf_counter() - start
    if not results:
        raise UserError("no candidate could be built: " + _reasons(skipped))
    best = next((r for r in results if r.fits), None)
    run_cfg = config_of(args.from_run) if args.from_run else None
    notes = [n for n in [cluster_note(max(ps)), unread] if n]
    notes += assumption_notes(args, inputs, skipped, max(ps), run_cfg)
    if args.from_run:
        from ppx.plan.rebalance import rebalance_note

        notes += [n for n in [rebalance_note(str(args.from_run), inputs, run_cfg)] if n]
        notes += [n for n in [regrouped_note(str(args.from_run), results[: args.top], inputs, run_cfg)] if n]
        priced = priced_split_note_of(args.from_run, results, inputs)
        if priced:
            notes.append(priced)
        if priced and any(s.reason.startswith(SPLIT_REASON) for s in skipped):  # both missing: one run for both
            from ppx.plan.calibrate import beside_command

            both = beside_command(str(args.from_run) + "/config.yaml", run_cfg, whole=True, apart=True)
            notes.append(
                f"note: one run measures both what the notes above miss: `{both}`, then plan --from-run that run"
                if both
                else "note: a plan reads one run, and no one run of this config measures both what the notes above "
                "miss: plan from each of the two runs they name and hold the two plans' candidates side by side"
            )
    if args.from_run and inputs.act_bytes is None:
        counted = "peaks count params only" if inputs.param_bytes is not None else "no peaks predicted"
        notes.append(f"note: {args.from_run} measured no saved bytes per microbatch: {counted}")
    close = near_best(results, args.close_pct)
    # every file first, then the lines: a plan cut short while printing (| head) leaves them whole
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "best.csv"
    how = []
    overrides = candidate_overrides(results, out, inputs, run_cfg, best)
    commands = [run_command(experiment, o) for o in overrides]
    if best:
        outputs.write_best(csv, best, inputs)
        how = [full_command(best, csv, experiment, inputs, run_cfg)]
        what = "run it with"
        if not args.from_run:  # runs as printed: the known-cost model at the planned costs
            how.append("  on your own experiment: " + command(best, csv, "<experiment>"))
            what = "run it (the known-cost model at the planned costs) with"
        failing = check(how[0])
        if failing:  # never print a command that fails without saying so
            how.append(f"  note: this command fails its config checks: {failing}")
    measuring = None  # (after best.csv is written: the measuring command names it)
    if run_cfg is not None and best is not None:
        from ppx.plan.paired_command import paired_command

        place = {id(r): k for k, r in enumerate(results)}
        baseline = [r for r in results if r.schedule == "1f1b" and r.fits]  # the field's reference, beside them
        picked = [best, *close]  # and the next best that fit, to MEASURED lists at least
        rest = [r for r in results if r.fits and r not in picked]
        measure, more, reference = (
            [(r.label(), r.p, r.m, overrides[place[id(r)]]) for r in rs] for rs in (picked, rest, baseline)
        )
        measuring = paired_command(measure, run_cfg, experiment, reference, more, MEASURED)
    if close:
        notes.append(
            f"note: {_names(close)} predicted within {args.close_pct:g}% of the best's "
            "throughput: closer than a prediction can tell apart (--close-pct); measure them before choosing"
        )
    if run_cfg is not None:
        from ppx.plan.beside import beside_note
        from ppx.report.run_dir import RunDir

        rows = RunDir(args.from_run).raw_summary.get("paired") or {}
        notes += [n for n in [beside_note(str(args.from_run), results, overrides, run_cfg, experiment, rows)] if n]
    if measuring:
        from ppx.plan.paired_command import note

        notes.append(f"note: a plan is a prediction; to measure {note(measuring)}")
    outputs.write_json(out / "plan.json", inputs, results, skipped, best, notes, close, commands)
    outputs.write_md(out / "plan.md", inputs, results, skipped, best, how, notes)
    pareto.draw(results, out / "plan.png", inputs.budget_bytes, f"ppx plan: {len(results)} candidates")
    print(
        f"ppx plan: {len(results)} candidates ({count(len(skipped), 'shape')} skipped), searched in {took:.1f} s, "
        f"costs from {inputs.source}"
    )
    print(table.text(results[: args.top], inputs.microbatch_size))
    if len(results) > args.top:
        print(f"... {len(results) - args.top} more in plan.md")
    for n in notes:
        print(n)
    if best:
        print(
            f"best: {best.label()}, predicted step {best.step_s * 1e3:.2f} ms (sync), steady-state "
            f"{best.steady_s * 1e3:.2f} ms; {what}:"
        )
        print("\n".join(how))
    files = ["plan.md", "plan.json", "plan.png"] + (["best.csv"] if best else [])
    print("ppx: wrote " + ", ".join(str(out / f) for f in files))
    if best is None:
        closest = min(results, key=lambda r: r.peak_max)
        over = closest.peak_max - inputs.budget_bytes
        print(
            f"ppx: error: nothing fits --mem-budget {args.mem_budget} per rank; the closest is "
            f"{closest.schedule} p={closest.p} m={closest.m} v={closest.v} at {format_bytes(closest.peak_max)} "
            f"({format_bytes(over)} over)",
            file=sys.stderr,
        )
        return 1
    return 0
