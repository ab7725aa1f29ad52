"""The ``ppx`` command line: argparse and dispatch. Each command lives in `ppx.commands`,
imported only when it runs (``ppx keys`` and ``ppx run``'s checks start without torch)."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys
import time

from ppx import __version__  # (the running code's: an editable install's metadata keeps its first)
from ppx.errors import UserError, os_words
from ppx.schedules.registry import names_help

MODULES = {
    "run": "run",
    "schedule": "schedule",
    "simulate": "simulate",
    "compare": "compare",
    "sweep": "compare",
    "keys": "keys",
    "split": "split",
    "plan": "plan",
    "gpu-check": "gpu_check",
}


def _command(name: str):
    """The function of command ``name``, imported when called."""

    def call(args) -> int:
        module = importlib.import_module(f"ppx.commands.{MODULES[name]}")
        return getattr(module, f"cmd_{name.replace('-', '_')}")(args)

    return call


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="ppx", description="pipeline-parallel experiment harness")
    ap.add_argument("--version", action="version", version=f"ppx {__version__}", help="print ppx's version and exit")
    sub = ap.add_subparsers(dest="command", required=True)
    ap.commands = sub.choices  # name -> its parser: an error after parsing names the sub-command's usage
    run = sub.add_parser("run", help="run an experiment: ppx run <name or yaml> [key=value ...]")
    run.add_argument("experiment", help="a name in experiments/ (e.g. gpipe_4gpu) or a YAML path")
    run.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="config overrides (ppx keys lists them)"
    )
    run.set_defaults(fn=_command("run"))
    sch = sub.add_parser("schedule", help="print a schedule's rank x time grid and its bubble")
    names = names_help()
    sch.add_argument("name", help=f"{names}, or a schedule CSV")
    sch.add_argument("--stages", "-p", type=int, help="ranks (default 4; a CSV's own)")
    sch.add_argument("--microbatches", "-m", type=int, help="microbatches (default 8; a CSV's own)")
    sch.add_argument(
        "--virtual",
        "-v",
        type=int,
        help="stages per rank (schedules that take several; default: the schedule's, 2 for those, else 1)",
    )
    sch.add_argument("--fwd", type=int, default=1, help="forward cost in grid slots (default 1)")
    sch.add_argument("--bwd", type=int, default=1, help="backward (input-gradient) cost in grid slots (default 1)")
    sch.add_argument(
        "--wgrad",
        type=int,
        help="weight-gradient cost in grid slots, B = bwd + wgrad (default: 1 for a schedule with W actions, else 0)",
    )
    sch.add_argument(
        "--transport",
        choices=["nccl", "gloo"],
        default="nccl",
        help="place and check sends/receives to run on nccl (batches complete in order; default, and then "
        "gloo runs it too) or gloo (each send/receive on its own, activations and gradients on their own groups)",
    )
    sch.add_argument(
        "--drain",
        action="store_true",
        help="split a backward only where its W comes after its stage's last forward, the others whole B's "
        "(what train.split_backward=drain runs)",
    )
    sch.add_argument("--actions", action="store_true", help="also list every rank's actions, comms included")
    sch.add_argument("--csv", help="write the schedule as torch-style CSV to this file")
    sch.add_argument("--with-comms", action="store_true", help="with --csv: include SEND/RECV actions")
    sch.set_defaults(fn=_command("schedule"))
    sim = sub.add_parser("simulate", help="predict each rank's timeline, step time and bubble from action costs")
    sim.add_argument("name", help=f"{names}, or a schedule CSV")
    sim.add_argument("--stages", "-p", type=int, help="ranks (default 4, or the --from-run run's)")
    sim.add_argument("--microbatches", "-m", type=int, help="microbatches (default 8, or the --from-run run's)")
    sim.add_argument(
        "--virtual",
        "-v",
        type=int,
        help="stages per rank (default: the schedule's, 2 where it takes several, else 1; or the run's)",
    )
    sim.add_argument("--fwd-ms", help="forward ms per microbatch: one value or one per stage (10,12,...); default 10")
    sim.add_argument("--bwd-ms", help="input-gradient backward ms, likewise; default 20")
    sim.add_argument("--wgrad-ms", help="weight-gradient ms, likewise (a full B costs bwd + wgrad); default 0")
    sim.add_argument(
        "--whole-ms",
        help="what a whole backward B costs, ms, likewise (default bwd + wgrad); less than bwd + wgrad where a "
        "split backward's I + W costs more than the B it replaces (its stores, W's own call); a stage that ppx's "
        "runtime runs whole (every I followed at once by its W, as ZB-H1's first) then costs it in its I",
    )
    sim.add_argument("--p2p-ms", type=_number, help="latency of one hand-off between ranks, ms; default 0")
    sim.add_argument("--send-post-ms", type=_number, help="time the runtime takes to post one send, ms; default 0")
    sim.add_argument("--recv-post-ms", type=_number, help="time the runtime takes to post one receive, ms; default 0")
    sim.add_argument(
        "--transport",
        choices=["nccl", "gloo"],
        help="nccl: batches complete in order, as one group "
        "(default) | gloo: each send/receive on its own, as ppx's runtime on gloo (default with --from-run "
        "of a gloo run)",
    )
    sim.add_argument(
        "--recv-lookahead",
        type=int,
        help="gloo: receives posted this many compute actions early, -1 all at a rank's first wait "
        "(default 0, or the run's runtime.recv_lookahead with --from-run); nccl takes none",
    )
    sim.add_argument("--from-run", type=run_path, help="take per-stage costs measured in this run directory instead")
    sim.add_argument(
        "--drain",
        action="store_true",
        help="the list train.split_backward=drain runs: a backward split only where its W comes after its stage's "
        "last forward (from a drain run, its B's cost as measured; from flags, --whole-ms; elsewhere a B costs I + W)",
    )
    sim.add_argument("--png", help="draw the predicted timeline to this PNG")
    sim.set_defaults(fn=_command("simulate"))
    _plan_parser(sub)
    cmp_ = sub.add_parser("compare", help="compare runs: table, markdown and PNG")
    cmp_.add_argument("runs", nargs="+", help="run directories, folders of runs, or globs")
    cmp_.add_argument("--out", help="a new (or empty) folder for compare.md/.json/.png (default runs/compare/<time>)")
    cmp_.add_argument("--print-only", action="store_true", help="print the table and its notes; write no folder")
    cmp_.set_defaults(fn=_command("compare"))
    swp = sub.add_parser("sweep", help="run the product of config values, then compare")
    swp.add_argument("experiment", help="a name in experiments/ or a YAML path, as for ppx run")
    swp.add_argument(
        "--sweep",
        action="append",
        help='e.g. "pipeline.schedule=gpipe,1f1b pipeline.microbatches=2,4,8" (every key in one --sweep)',
    )
    swp.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every point N times, in rounds (each point once, then again); ppx compare pools repeated "
        "run.paired jobs of one config",
    )
    swp.add_argument("--launcher", choices=["local", "slurm"], default="local", help="slurm: one sbatch job per point")
    swp.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="applied to every point")
    swp.set_defaults(fn=_command("sweep"))
    _gpu_check_parser(sub)
    spl = sub.add_parser("split", help="how a config splits its model over the stages, before any run")
    spl.add_argument("experiment", help="a name in experiments/ or a YAML path, as ppx run takes it")
    spl.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="config overrides")
    spl.set_defaults(fn=_command("split"))
    keys = sub.add_parser("keys", help="list every config key with its default and meaning")
    keys.add_argument("text", nargs="?", help="only the keys whose name holds this text (train., wandb, hf_)")
    keys.add_argument("--markdown", action="store_true", help="as a markdown table (docs/config.md holds it)")
    keys.set_defaults(fn=_command("keys"))
    return ap


def _plan_parser(sub) -> None:
    pl = sub.add_parser(
        "plan", help="search schedules x p x m x v on given or measured costs under a memory budget, ranked"
    )
    pl.add_argument(
        "--from-run",
        metavar="DIR",
        type=run_path,
        help="costs, saved bytes, transport and p measured in this run directory",
    )
    per = "one value or one per stage (or per layer with --per-layer)"
    pl.add_argument("--fwd-ms", metavar="X", help=f"forward ms per microbatch: {per}")
    pl.add_argument("--bwd-ms", metavar="X", help="input-gradient backward ms, likewise")
    pl.add_argument(
        "--wgrad-ms", metavar="X", help="weight-gradient ms, likewise (a full B costs bwd + wgrad); default 0"
    )
    kept = "this machine's kept calibration (--calibrate) if any, else 0"
    pl.add_argument(
        "--p2p-ms",
        metavar="X",
        type=_number,
        help=f"latency of one hand-off between ranks, ms; default {kept} (with --from-run: a one-rank run's)",
    )
    pl.add_argument(
        "--overhead-ms",
        metavar="X",
        type=_number,
        help=f"the runtime's time around each compute action, ms; default {kept}",
    )
    pl.add_argument(
        "--machine-from",
        metavar="DIR",
        type=run_path,
        help="with cost flags: this machine's runtime overhead per action, hand-off and posting times, transport "
        "and receive lookahead, measured in this run directory (a short calibration run: the plan's header "
        "prints one); default: the flags, else this machine's newest kept calibration (--calibrate), else 0",
    )
    pl.add_argument(
        "--calibrate",
        nargs="?",
        const="reuse",
        choices=["reuse", "new"],
        help="with cost flags: this machine's figures (as --machine-from) from a short known-cost run ppx makes "
        "at the plan's p and keeps in ~/.cache/ppx ($PPX_CACHE_DIR): the newest one there, or a new one "
        "(--calibrate new)",
    )
    pl.add_argument(
        "--act-bytes", metavar="SIZE[,SIZE...]", help="bytes one microbatch's forward saves (e.g. 64MiB), likewise"
    )
    pl.add_argument(
        "--per-layer",
        action="store_true",
        help="the lists are per layer: p can be searched and a stage costs the sum of its layers; without it "
        "they are per stage at one p, and v stages per rank cut each stage into v equal parts (cost/v, bytes/v)",
    )
    pl.add_argument(
        "--mem-budget",
        metavar="SIZE",
        help="memory per rank for activations + params (e.g. 40GiB; a number alone is bytes); default none",
    )
    pl.add_argument(
        "--param-bytes",
        metavar="SIZE[,...]",
        help="weights + gradients + optimizer state per stage (or per layer), added to the peak; default, with "
        "--from-run, the run's own (its param_bytes x (2 + 0 for sgd, 2 for adamw), with instrument.memory on)",
    )
    pl.add_argument(
        "--schedules", metavar="all|a,b,...", default="all", help="all (every training family and zb_auto) or a,b,..."
    )
    pl.add_argument(
        "--stages",
        "-p",
        metavar="P[,P...]",
        help="p: one (per-stage costs) or a list 2,4,8 (--per-layer, --from-run); default 4 or the run's",
    )
    pl.add_argument(
        "--microbatches", "-m", metavar="M[,M...]", help="m: one or a list 8,16,32; default 8, or the run's"
    )
    pl.add_argument(
        "--virtual", "-v", metavar="V[,V...]", help="v for families taking several stages per rank; default 2,3,4"
    )
    pl.add_argument(
        "--rank-by",
        choices=["sync", "steady"],
        default="sync",
        help="the step that ranks candidates (and that zb_auto minimises): sync, every rank starting together "
        "(what ppx run measures; default) | steady, the longest rank's own span (consecutive steps with no rank "
        "waiting at a step boundary: the zero-bubble paper's cost); both are reported",
    )
    pl.add_argument("--transport", choices=["nccl", "gloo"], help="default nccl, or the run's (a calibration's: gloo)")
    pl.add_argument(
        "--out", metavar="DIR", help="a new folder for plan.md/.json/.png and best.csv (default plans/<UTC time>)"
    )
    pl.add_argument("--top", metavar="N", type=int, default=10, help="rows printed (default 10; the files hold all)")
    pl.add_argument(
        "--close-pct",
        metavar="PCT",
        type=_number,
        default=2.0,  # ppx.plan.search.CLOSE_PCT (not imported: the CLI starts fast)
        help="candidates predicted within PCT %% of the best's throughput are named as too close to call "
        "(default 2: the plan's step error measured up to 2%% by make bench)",
    )
    pl.add_argument("--jobs", metavar="N", type=int, help="processes evaluating candidates (default min(2, CPUs))")
    pl.set_defaults(fn=_command("plan"))


def _gpu_check_parser(sub) -> None:
    gc = sub.add_parser(
        "gpu-check",
        help="check every CUDA path (timers, memory, profiler, bf16, overlap, NCCL, throughput, split backward) on this machine's GPUs",
    )
    gc.add_argument(
        "--out", metavar="DIR", help="a new folder for gpu-check.md/.json and the runs (default gpu-checks/<UTC time>)"
    )
    gc.add_argument(
        "--only",
        metavar="a,b",
        help="these checks only: timers, memory, saved, profiler, bf16, overlap, nccl, throughput, split",
    )
    gc.add_argument(
        "--budget-s",
        metavar="S",
        type=_number,
        help="seconds the runs may take; runs that would not fit are skipped (default 540)",
    )
    gc.add_argument(
        "--docs", metavar="FILE", help="also put the table, date and device between FILE's gpu-check markers"
    )
    gc.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs and their estimated seconds, check their configs; run nothing",
    )
    gc.add_argument(
        "--gpus", metavar="N", type=int, help="with --dry-run: plan for N GPUs (default: this machine's, at least 1)"
    )
    gc.add_argument(
        "--on-cpu", action="store_true", help=argparse.SUPPRESS
    )  # tests: the whole machinery on CPU with gloo
    gc.set_defaults(fn=_command("gpu-check"))


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (the usage is a -h away); sub-commands' too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} -h)\n")


def run_path(text: str) -> str:
    """A run directory as given, without the trailing slashes a shell's completion adds (the
    notes and commands that name it read ``<run>'s costs``, ``<run>/config.yaml``)."""
    return text.rstrip("/") or text


def _number(text: str) -> float:
    """A finite number (argparse's type for numeric options: no nan, no inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


NEGATIVE = re.compile(r"-(\d|\.\d|inf\b|nan\b)", re.IGNORECASE)


def _joined_negatives(ap, argv: list[str]) -> list[str]:
    """``--opt -5GiB`` as ``--opt=-5GiB`` (``-m -8,16`` as ``-m-8,16``) for an option of the
    command that takes one value: argparse takes a value that starts with a dash and is not a
    plain number (a size, a list, -inf) for an option and says "expected one argument"; so the
    value reaches the option's own check. Nothing after ``--``."""
    sub, out = None, []
    for k, arg in enumerate(argv):
        if arg == "--":
            return out + argv[k:]
        if sub is None and not arg.startswith("-"):
            sub = ap.commands.get(arg)
        action = sub._option_string_actions.get(out[-1]) if sub is not None and out else None
        if action is not None and action.nargs is None and action.option_strings and NEGATIVE.match(arg):
            out[-1] = f"{out[-1]}={arg}" if out[-1].startswith("--") else out[-1] + arg
        else:
            out.append(arg)
    return out


def _reader_gone() -> int:
    """SIGPIPE's exit status, stdout pointed at /dev/null: what its buffer holds goes nowhere at exit."""
    from ppx.files import stdout_to_null

    stdout_to_null()
    return 141


def main(argv=None) -> int:
    from ppx.commands.common import check_start
    from ppx.launch.closed_stdout import open_closed_std_streams

    open_closed_std_streams()
    ap = parser()
    try:
        args, extra = ap.parse_known_args(_joined_negatives(ap, sys.argv[1:] if argv is None else list(argv)))
    except SystemExit:  # (--version, --help: what they printed flushed here, a pipe no one reads quietly)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            return _reader_gone()
        raise
    if extra:  # key=value overrides may come after options: ppx sweep EXP --sweep ... a=1 b=2
        if not hasattr(args, "overrides") or any(x.startswith("-") for x in extra):
            ap.commands.get(args.command, ap).error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    try:
        check_start(sys.argv[1:] if argv is None else list(argv))
        return args.fn(args)
    except UserError as e:
        if os.environ.get("RANK", "0") == "0":  # under torchrun, one line from rank 0 only
            print(f"ppx: error: {e}", file=sys.stderr)
        else:  # give rank 0 time to say it: torchrun stops every rank once one has exited
            time.sleep(5)
        return 2
    except BrokenPipeError:  # the reader went away (ppx keys | head): stop quietly
        return _reader_gone()
    except OSError as e:  # a path given on the command line or in the config cannot be written or read
        print(f"ppx: error: {os_words(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
