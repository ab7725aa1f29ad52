"""`ppx compare` and `ppx sweep`: runs side by side, and the runs of a grid of config values."""

from __future__ import annotations

import sys
from pathlib import Path

from ppx.commands.common import empty_or_new, wrote
from ppx.errors import UserError, os_words


def compare_into(patterns: list[str], out: Path, pages: bool = True, tensorboard: bool = True) -> None:
    """Compare the runs ``patterns`` name into ``out``: the table printed, the files (with
    ``pages``, the pictures and report.html, named last) and (``tensorboard``) their
    TensorBoard folder written and listed."""
    from ppx.report.compare import compare
    from ppx.report.tensorboard import log_comparison

    print(compare(patterns, out, pages))
    if tensorboard:
        log_comparison(out)
    wrote(out)
    if pages:
        print(f"ppx: report: {out / 'report.html'}")


def cmd_compare(args) -> int:
    import time

    if args.print_only:  # the table and its notes, nothing written
        if args.out:
            raise UserError("--print-only writes nothing: leave out --out")
        from ppx.report.compare import compare

        print(compare(args.runs, None, pages=False))
        return 0
    if args.out:
        out = Path(args.out)
        # never into a run (its report.html and tb/ would be the comparison's); a sweep's folder,
        # which holds runs, takes its comparison (slurm/compare.sbatch), once (`compare`)
        if any((out / f).exists() for f in ("config.yaml", "summary.json")):
            run = out
        else:
            from ppx.report.run_dir import is_run_folder

            run = next((q for q in out.resolve().parents if is_run_folder(q)), None)
        if run is not None:
            inside = f"{'a file' if out.is_file() else 'a folder' if out.exists() else 'a path'} inside the run {run}"
            what = "a run's folder" if run.resolve() == out.resolve() else inside
            raise UserError(f"--out {out} is {what}; ppx never writes into a run (choose another --out)")
        if out.is_file():
            raise UserError(f"--out {out} is a file; give a folder for the comparison (a new one)")
    else:  # runs/compare/<time>, or <time>-2, ... when a comparison of the same second has it
        base = Path("runs") / "compare" / time.strftime("%Y%m%d-%H%M%S")
        out = next(
            o for k in range(1, 1000) if not (o := base.with_name(base.name + (f"-{k}" if k > 1 else ""))).exists()
        )
    # a sweep's folder compared into itself (slurm/compare.sbatch): drawn as its runs were
    own = len(args.runs) == 1 and Path(args.runs[0]).resolve() == out.resolve()
    if args.out and not own:  # (report.html, compare.png, tb/ of whatever is there would be replaced)
        empty_or_new("--out", out)
    compare_into(args.runs, out, *(_drawn(_runs_in(out)) if own else (True, True)))
    return 0


def _runs_in(sweep: Path) -> list:
    """The run folders of a sweep's folder (`RunDir`s), completed or not."""
    from ppx.report.run_dir import RunDir

    return [RunDir(p) for p in sweep.iterdir() if p.is_dir()]


def _drawn(runs: list) -> tuple[bool, bool]:
    """(pages, TensorBoard) for a sweep's comparison: what its completed runs drew
    (logging.report, logging.tensorboard), any of them."""
    logged = [r.config.logging for r in runs if r.is_complete]
    return any(x.report for x in logged), any(x.tensorboard for x in logged)


def cmd_sweep(args) -> int:
    from ppx.launch.closed_stdout import survive_closed_output
    from ppx.launch.sweep import SweepStopped, run_sweep

    survive_closed_output()  # (ppx sweep ... | head: the points go on, as a run's job does)

    if args.sweep and len(args.sweep) > 1:  # (the last would silently replace the others)
        raise UserError(
            f'--sweep given {len(args.sweep)} times; give every key in one: --sweep "{" ".join(args.sweep)}"'
        )
    try:
        root, failed = run_sweep(
            args.experiment, args.sweep[0] if args.sweep else None, args.overrides, args.launcher, args.repeat
        )
    except SweepStopped as e:
        print(
            f"ppx sweep: stopped by {e}: point {e.point}/{e.points} was ended, no later point ran; "
            f"runs so far: {e.root}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + e.signum
    if args.launcher != "local":
        return 0
    runs = _runs_in(root)
    done = [r for r in runs if r.is_complete]
    if not done:  # (runs that failed, not bad input: 1, as a sweep with some failed points)
        print(f"ppx: error: no run of the sweep completed; see {root}", file=sys.stderr, flush=True)
        return 1
    try:
        compare_into([str(root)], root, *_drawn(done))
    except OSError as e:  # (its runs are done: a failure of the sweep's, not bad input)
        print(f"ppx: error: the sweep's comparison was not written ({os_words(e)}); its runs: {root}", file=sys.stderr)
        return 1
    # (a point that failed before its run folder was made is in ``failed`` only)
    return 0 if len(done) == len(runs) and not failed else 1
