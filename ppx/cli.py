"""The ``ppx`` command: ``run`` an experiment, print a ``schedule`` grid, list config ``keys``."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ppx.errors import UserError


def cmd_run(args) -> int:
    from ppx import config, launch, rundir
    from ppx.config import resolve_schedule

    cfg = config.load(args.experiment, args.overrides)
    world = resolve_schedule(cfg).num_ranks
    command = " ".join(shlex.quote(a) for a in ["ppx", "run", args.experiment, *args.overrides])
    mode = launch.launched_by()
    if mode is not None:
        if mode == "srun":
            launch.adopt_srun_env()
        have = int(os.environ["WORLD_SIZE"])
        if have != world:
            raise UserError(
                f"pipeline.stages={world} but this job has {have} processes (WORLD_SIZE); start one process per stage"
            )
        os.environ.setdefault("PPX_COMMAND", command)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        device, notice = launch.choose_device(cfg.runtime.device, local, multi_node=have != local)
        if notice and os.environ.get("RANK") == "0":
            print(notice, file=sys.stderr)
        from ppx.worker import run_rank

        return run_rank(cfg, None, device)

    device, notice = launch.choose_device(cfg.runtime.device, world)
    if notice:
        print(notice, file=sys.stderr)
    run_dir = rundir.claim(cfg)
    (run_dir / "config.yaml").write_text(config.to_yaml(cfg))
    env = launch.worker_env(device, cfg.runtime.threads_per_rank, command)
    if world == 1:
        os.environ.update(env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        from ppx.worker import run_rank

        return run_rank(cfg, run_dir, device)
    code = subprocess.run(launch.torchrun_command(world, run_dir), env=env).returncode
    if code != 0:
        _explain_failure(run_dir, world, code)
    return code


def _explain_failure(run_dir: Path, world: int, code: int) -> None:
    """Name what each rank was doing when the job ended (from the watchdog's status files)."""
    from ppx.watchdog import read_status

    states = [f"rank {r}: {read_status(run_dir / 'status' / f'rank{r}.txt') or 'not started'}" for r in range(world)]
    print(f"ppx: error: the job failed (exit {code}); where each rank was: " + "; ".join(states), file=sys.stderr)
    print(f"ppx: run directory (incomplete): {run_dir}", file=sys.stderr)


def _schedule(name: str, stages, microbatches, virtual):
    """A schedule CSV, or a named schedule; torch.distributed.pipelining's schedules as the ppx
    list of the same order. ``stages``/``microbatches`` None: 4 and 8, or the CSV's (which
    given ones must match); ``virtual`` None: 2 for interleaved schedules, else 1 (as ppx run)."""
    from ppx import schedules

    if name.endswith(".csv"):
        sched = schedules.from_csv(name)
        v = sched.stages_per_rank
        for option, given, has in (("--stages", stages, sched.num_ranks), ("--microbatches", microbatches,
                                   sched.num_microbatches), ("--virtual", virtual, v)):
            if given is not None and given != has:
                raise UserError(f"{name} is a schedule for {sched.num_ranks} ranks, {v} stage(s) each and "
                                f"{sched.num_microbatches} microbatches; {option} {given} does not match (leave it out)")
        return sched
    stages = 4 if stages is None else stages
    microbatches = 8 if microbatches is None else microbatches
    family = schedules.TORCH_SCHEDULES.get(name, name)
    if family != name:
        print(f"{name}: torch.distributed.pipelining's schedule runs the order of ppx's {family}", flush=True)
    if virtual is None:
        virtual = 2 if family == "interleaved_1f1b" else 1
    return schedules.build(family, stages, microbatches, virtual)


def _output_path(option: str, path) -> None:
    """Fail before any work when ``path`` (an output file) could not be written."""
    if path is None:
        return
    folder = Path(path).parent
    if not folder.is_dir():
        raise UserError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{option} {path}: folder {folder} is not writable")


def cmd_schedule(args) -> int:
    from ppx import schedules
    from ppx.schedules.grid import render_grid

    _output_path("--csv", args.csv)
    if args.with_comms and not args.csv:
        raise UserError("--with-comms only shapes the --csv file; add --csv FILE (or use --actions to print comms)")

    if args.fwd < 1 or args.bwd < 1 or args.wgrad < 0:
        raise UserError(f"--fwd and --bwd must be >= 1 grid slot and --wgrad >= 0 (got {args.fwd}, {args.bwd}, {args.wgrad})")
    sched = _schedule(args.name, args.stages, args.microbatches, args.virtual)
    args.virtual = sched.stages_per_rank
    costs = schedules.Costs(fwd=args.fwd, bwd=args.bwd, wgrad=args.wgrad)
    p, m = sched.num_ranks, sched.num_microbatches
    b = args.bwd + args.wgrad
    print(f"{sched.name}: {p} ranks, {sched.num_stages} stages, {m} microbatches "
          f"(F = {args.fwd:g} slot{'s' if args.fwd != 1 else ''}, B = {b:g} slot{'s' if b != 1 else ''}"
          + (f", I = {args.bwd:g}, W = {args.wgrad:g}" if args.wgrad else "") + ")")
    print(render_grid(sched, costs))
    timeline = schedules.simulate(sched, costs)
    fam = schedules.FAMILIES.get(sched.name)
    line = f"bubble (idle share of the step): simulated {timeline.bubble_fraction():.1%}"
    if fam is not None:
        th = fam.bubble(p, m, args.virtual)
        line += f", theory {fam.bubble_formula} = {th:.1%}; as a share of the ideal time: {th / (1 - th):.1%}"
    print(line)
    if args.actions:
        print(sched.format())
    if args.csv:
        with_comms = args.with_comms or sched.groups is not None
        schedules.write_csv(sched if with_comms else sched.compute_only(), args.csv)
        note = "" if with_comms == args.with_comms else \
            f" with its SEND/RECV actions: {sched.name} batches sends with computes, which compute actions alone cannot say"
        print(f"wrote {args.csv}{note}")
    return 0


def cmd_compare(args) -> int:
    import time

    from ppx.report.compare import compare

    out = Path(args.out) if args.out else Path("runs") / "compare" / time.strftime("%Y%m%d-%H%M%S")
    print(compare(args.runs, out))
    _wrote(out)
    return 0


def _wrote(out: Path) -> None:
    files = [out / f for f in ("compare.md", "compare.json", "compare.png", "bubble.png") if (out / f).exists()]
    print("ppx: wrote " + ", ".join(map(str, files)))


def cmd_sweep(args) -> int:
    from ppx.report.compare import compare
    from ppx.sweep import run_sweep

    root = run_sweep(args.experiment, args.sweep, args.overrides, args.launcher)
    if args.launcher != "local":
        return 0
    done = list(root.glob("*/summary.json"))
    if not done:
        raise UserError(f"no run of the sweep completed; see {root}")
    print(compare([str(root)], root))
    _wrote(root)
    expected = len(list(p for p in root.iterdir() if p.is_dir()))
    return 0 if len(done) == expected else 1


def _ms_list(option: str, text: str, stages: int) -> list[float]:
    """'10' or '10,12,...' (one per stage) milliseconds -> seconds per stage."""
    from ppx.models.costs import per_stage_ms

    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"{option} {text}: give milliseconds, one number or one per stage (e.g. 10 or 10,12)") from None
    return [v / 1e3 for v in per_stage_ms(option, values[0] if len(values) == 1 else values, stages)]


def cmd_simulate(args) -> int:
    import json

    from ppx import schedules
    from ppx.prediction import costs_from, transport_of

    _output_path("--png", args.png)
    for option, value in (("--p2p-ms", args.p2p_ms), ("--send-post-ms", args.send_post_ms), ("--recv-post-ms", args.recv_post_ms)):
        if value < 0:
            raise UserError(f"{option} must be >= 0, got {value:g}")
    if args.recv_lookahead is not None and args.recv_lookahead < -1:
        raise UserError(f"--recv-lookahead must be -1 (all at the first wait) or >= 0, got {args.recv_lookahead}")
    measured = None
    if args.from_run:
        path = Path(args.from_run) / "summary.json"
        if not path.exists():
            raise UserError(f"{args.from_run} has no summary.json")
        summary = json.loads(path.read_text())
        if "measured_costs" not in summary:
            raise UserError(f"{args.from_run} has no measured costs (run it with instrument.timers and instrument.timeline on)")
        ran = (summary.get("world_size"), summary.get("virtual_stages") or 1)
        if not args.name.endswith(".csv"):  # the run's shape unless given (a CSV has its own)
            for attr, key in (("stages", "world_size"), ("microbatches", "microbatches"), ("virtual", "virtual_stages")):
                if getattr(args, attr) is None:
                    setattr(args, attr, summary.get(key))
            if (args.stages, args.virtual or 1) != ran:
                raise UserError(f"{args.from_run} ran {ran[0]} ranks with {ran[1]} stage(s) each; its costs are per "
                                "stage, so leave out --stages/--virtual or give the same")
    sched = _schedule(args.name, args.stages, args.microbatches, args.virtual)
    if args.from_run and (sched.num_ranks, sched.stages_per_rank) != ran:
        raise UserError(f"{args.from_run} ran {ran[0]} ranks with {ran[1]} stage(s) each, {args.name} has "
                        f"{sched.num_ranks} with {sched.stages_per_rank}; the run's costs are per stage")
    args.virtual = sched.stages_per_rank
    if not args.from_run:
        n = sched.num_stages
        costs = schedules.Costs(fwd=_ms_list("--fwd-ms", args.fwd_ms, n), bwd=_ms_list("--bwd-ms", args.bwd_ms, n),
                                wgrad=_ms_list("--wgrad-ms", args.wgrad_ms, n), p2p=args.p2p_ms / 1e3,
                                send_post=args.send_post_ms / 1e3, recv_post=args.recv_post_ms / 1e3)
        transport, lookahead = "nccl", 0
    else:
        costs = costs_from(summary["measured_costs"], sched.num_stages)
        measured = summary
        from ppx import config

        env = Path(args.from_run) / "env.json"
        backend = json.loads(env.read_text()).get("backend", "gloo") if env.exists() else "gloo"
        transport, lookahead = transport_of(config.from_yaml(Path(args.from_run) / "config.yaml"), backend)
    transport = args.transport or transport
    lookahead = args.recv_lookahead if args.recv_lookahead is not None else lookahead
    t = schedules.simulate(sched, costs, transport, lookahead)
    p, m = sched.num_ranks, sched.num_microbatches
    print(f"{sched.name}: {p} ranks, {sched.num_stages} stages, {m} microbatches")
    print(f"predicted step time {t.makespan * 1e3:.2f} ms, bubble {t.bubble_fraction():.1%} (idle / step time)")
    for r in range(p):
        print(f"  rank {r}: compute {t.compute[r] * 1e3:.2f} ms, comm {t.comm[r] * 1e3:.2f} ms, idle {t.idle(r) * 1e3:.2f} ms")
    fam = schedules.FAMILIES.get(sched.name)
    if fam is not None:
        print(f"theory ({fam.bubble_formula}): {fam.bubble(p, m, args.virtual):.1%}")
    if measured is not None:  # over the steps the costs come from, as the run's own report
        step = measured.get("measured_step_time_s", measured["step_time_s"])
        bubble = measured.get("measured_bubble_fraction", measured.get("bubble_fraction", float("nan")))
        print(f"measured in {args.from_run}: step {step * 1e3:.2f} ms ({step / t.makespan - 1:+.1%} against the prediction), "
              f"bubble {bubble:.1%}")
    if args.png:
        from ppx.report.gantt import draw_step

        spans = {r: [("compute", str(e.action), [str(e.action)], e.start, e.end) for e in row] for r, row in enumerate(t.events)}
        draw_step(spans, Path(args.png), f"{sched.name} p={p} m={m}: predicted {t.makespan * 1e3:.1f} ms, bubble {t.bubble_fraction():.1%}",
                  sched.stage_to_rank, xlabel="predicted time in the step (ms)")
        print(f"wrote {args.png}")
    return 0


def cmd_keys(args) -> int:
    from ppx.config import describe

    if args.markdown:
        print("| key | default | meaning |\n| --- | --- | --- |")
        for key, default, help in describe():
            print(f"| `{key}` | `{default}` | " + help.replace("|", "\\|") + " |")
        return 0
    for key, default, help in describe():
        print(f"{key:28} {default:10} {help}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ppx", description="pipeline-parallel experiment harness")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment: ppx run <name or yaml> [key=value ...]")
    run.add_argument("experiment", help="a name in experiments/ (e.g. gpipe_4gpu) or a YAML path")
    run.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="config overrides (ppx keys lists them)")
    run.set_defaults(fn=cmd_run)
    sch = sub.add_parser("schedule", help="print a schedule's rank x time grid and its bubble")
    names = "naive | gpipe | 1f1b | forward_only | interleaved_1f1b | zb_h1 | torch_gpipe | torch_1f1b | torch_interleaved1f1b"
    sch.add_argument("name", help=f"{names}, or a schedule CSV")
    sch.add_argument("--stages", "-p", type=int, help="ranks (default 4; a CSV's own)")
    sch.add_argument("--microbatches", "-m", type=int, help="microbatches (default 8; a CSV's own)")
    sch.add_argument("--virtual", "-v", type=int, help="stages per rank (interleaved_1f1b; default 2 there, else 1)")
    sch.add_argument("--fwd", type=int, default=1, help="forward cost in grid slots (default 1)")
    sch.add_argument("--bwd", type=int, default=1, help="backward (input-gradient) cost in grid slots (default 1)")
    sch.add_argument("--wgrad", type=int, default=0, help="weight-gradient cost in grid slots, B = bwd + wgrad (default 0)")
    sch.add_argument("--actions", action="store_true", help="also list every rank's actions, comms included")
    sch.add_argument("--csv", help="write the schedule as torch-style CSV to this file")
    sch.add_argument("--with-comms", action="store_true", help="with --csv: include SEND/RECV actions")
    sch.set_defaults(fn=cmd_schedule)
    sim = sub.add_parser("simulate", help="predict each rank's timeline, step time and bubble from action costs")
    sim.add_argument("name", help=f"{names}, or a schedule CSV")
    sim.add_argument("--stages", "-p", type=int, help="ranks (default 4, or the --from-run run's)")
    sim.add_argument("--microbatches", "-m", type=int, help="microbatches (default 8, or the --from-run run's)")
    sim.add_argument("--virtual", "-v", type=int, help="stages per rank (default 2 for interleaved_1f1b, else 1; or the run's)")
    sim.add_argument("--fwd-ms", default="10", help="forward ms per microbatch: one value or one per stage (10,12,...); default 10")
    sim.add_argument("--bwd-ms", default="20", help="input-gradient backward ms, likewise; default 20")
    sim.add_argument("--wgrad-ms", default="0", help="weight-gradient ms, likewise (a full B costs bwd + wgrad); default 0")
    sim.add_argument("--p2p-ms", type=float, default=0.0, help="latency of one hand-off between ranks, ms; default 0")
    sim.add_argument("--send-post-ms", type=float, default=0.0, help="time the runtime takes to post one send, ms; default 0")
    sim.add_argument("--recv-post-ms", type=float, default=0.0, help="time the runtime takes to post one receive, ms; default 0")
    sim.add_argument("--transport", choices=["nccl", "gloo"], help="nccl: batches complete in order, as one group "
                     "(default) | gloo: each send/receive on its own, as ppx's runtime on gloo (default with --from-run "
                     "of a gloo run)")
    sim.add_argument("--recv-lookahead", type=int, help="gloo: receives posted this many compute actions early, -1 all at a rank's first wait "
                     "(default 0, or the run's runtime.recv_lookahead with --from-run)")
    sim.add_argument("--from-run", help="take per-stage costs measured in this run directory instead")
    sim.add_argument("--png", help="draw the predicted timeline to this PNG")
    sim.set_defaults(fn=cmd_simulate)
    cmp_ = sub.add_parser("compare", help="compare runs: table, markdown and PNG")
    cmp_.add_argument("runs", nargs="+", help="run directories, folders of runs, or globs")
    cmp_.add_argument("--out", help="where compare.md/.json/.png go (default runs/compare/<time>)")
    cmp_.set_defaults(fn=cmd_compare)
    swp = sub.add_parser("sweep", help="run the product of config values, then compare")
    swp.add_argument("experiment", help="a name in experiments/ or a YAML path, as for ppx run")
    swp.add_argument("--sweep", required=True, help='e.g. "pipeline.schedule=gpipe,1f1b pipeline.microbatches=2,4,8"')
    swp.add_argument("--launcher", choices=["local", "slurm"], default="local", help="slurm: one sbatch job per point")
    swp.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="applied to every point")
    swp.set_defaults(fn=cmd_sweep)
    keys = sub.add_parser("keys", help="list every config key with its default and meaning")
    keys.add_argument("--markdown", action="store_true", help="as the README's markdown table")
    keys.set_defaults(fn=cmd_keys)
    return ap


def main(argv=None) -> int:
    ap = parser()
    args, extra = ap.parse_known_args(argv)
    if extra:  # key=value overrides may come after options: ppx sweep EXP --sweep ... a=1 b=2
        if not hasattr(args, "overrides") or any(x.startswith("-") for x in extra):
            ap.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    try:
        return args.fn(args)
    except UserError as e:
        if os.environ.get("RANK", "0") == "0":  # under torchrun, one line from rank 0 only
            print(f"ppx: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (ppx keys | head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # a path given on the command line or in the config cannot be written or read
        where = f": {e.filename}" if e.filename else ""
        print(f"ppx: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
