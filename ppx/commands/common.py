"""What the commands share: the schedule a command line names, output paths checked before
any work, the list of files written."""

from __future__ import annotations

import os
from pathlib import Path

from ppx.errors import ScheduleError, UserError
from ppx.units import stage_list


def check_start(argv: list[str]) -> None:
    """Refuse, in one line, what no command can run from: a current folder deleted under the
    shell (experiments, run.root and every relative path resolve from it), and an argument
    holding a byte that is not UTF-8 (ppx writes its arguments into UTF-8 files: config.yaml)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise UserError(
            "the current folder no longer exists (deleted after the shell entered it): cd to one that does"
        ) from None
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as e:  # (Python keeps such a byte as a lone surrogate, U+DC80-U+DCFF)
            shown = os.fsencode(arg).decode("utf-8", "backslashreplace")
            byte = ord(arg[e.start]) - 0xDC00
            raise UserError(
                f"{shown}: a byte that is not UTF-8 (\\x{byte:02x}); ppx writes its arguments into UTF-8 files "
                "(config.yaml): give it in UTF-8"
            ) from None


def schedule_from(name: str, stages, microbatches, virtual, transport: str = "nccl"):
    """A schedule CSV, or a named schedule; torch.distributed.pipelining's schedules as the ppx
    list of the same order. ``stages``/``microbatches`` None: 4 and 8, or the CSV's (which
    given ones must match); ``virtual`` None: the schedule's default (2 where it takes several stages per rank, else 1), as ppx run.
    Sends and receives are placed, and checked, to run under ``transport``."""
    from ppx import schedules

    if schedules.is_csv(name):
        sched = schedules.from_csv(name, transport)
        held = set(sched.stages_held())
        for option, given, fits in (
            ("--stages", stages, lambda x: x == sched.num_ranks),
            ("--microbatches", microbatches, lambda x: x == sched.num_microbatches),
            ("--virtual", virtual, lambda x: held == {x}),
        ):
            if given is not None and not fits(given):
                raise UserError(
                    f"{name} is a schedule for {sched.num_ranks} ranks, placing {sched.holding()}, and "
                    f"{sched.num_microbatches} microbatches; {option} {given} does not match (leave it out)"
                )
        return sched
    stages = 4 if stages is None else stages
    microbatches = 8 if microbatches is None else microbatches
    try:
        sched = schedules.build(name, stages, microbatches, virtual, transport)
    except ScheduleError as e:  # a shape rule names the config's keys: these are the options
        said = str(e)
        for key, option in FLAGS.items():
            said = said.replace(key, option)
        raise ScheduleError(said.replace(" or null", " or left out")) from None
    if schedules.is_torch(name):  # (after the build: a refused shape says only why)
        print(
            f"{name}: torch.distributed.pipelining's schedule runs the order of ppx's {schedules.family_name(name)}",
            flush=True,
        )
    return sched


# the config keys a shape rule names -> the options of ppx schedule and ppx simulate
FLAGS = {
    "pipeline.microbatches": "--microbatches (-m)",
    "pipeline.virtual_stages": "--virtual (-v)",
    "pipeline.stages": "--stages (-p)",
}


def ms_list(option: str, text: str, count: int | None) -> list[float]:
    """'10' or '10,12,...' milliseconds -> seconds: ``count`` values (one given is repeated),
    or with ``count`` None the values as given (one per layer, any number)."""
    from ppx.models.costs import per_stage_ms

    try:
        values = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise UserError(f"{option} {text}: give milliseconds, one number or one per stage (e.g. 10 or 10,12)") from None
    return [v / 1e3 for v in per_stage_ms(option, values[0] if len(values) == 1 else values, count, typed=text)]


def measured_run(path: str, backward: bool = True):
    """The run directory ``path`` and its summary, which must hold measured costs: with
    ``backward``, of every stage's backward too (a forward-only run's are 0, not unknown)."""
    from ppx.report.run_dir import RunDir

    run = RunDir(path)
    costs = run.summary.measured_costs
    if costs is None:
        raise UserError(f"{path} has no measured costs (run it with instrument.timers and instrument.timeline on)")
    if backward:
        require_backward(path, run.summary)
    return run, run.summary


def measured_ops(summary) -> set[str]:
    """The kinds of action (F, B, I, W) a run's measured costs hold."""
    return {key[-1] for key in summary.measured_costs["action_s"]}


def whole_stages(run) -> list[int]:
    """The stages a run (a `RunDir`) ran whole under a split schedule (its I followed at once
    by its W, so the I took the whole backward): their I and W were not measured apart."""
    ways = run.raw_summary.get("split_backward") or {}
    return sorted(int(s) for s, way in ways.items() if ran_whole(way))


def ran_whole(way: dict | None) -> bool:
    """Whether a stage's ``split_backward`` entry (a run's or an entry's) says it ran whole with
    its I and W not measured apart: not a stage of no parameter, whose I is its backward and
    whose W, nothing, is measured all the same."""
    return (way or {}).get("mode") == "whole" and not way.get("no_parameters")


def split_only_stages(run) -> list[int]:
    """The stages whose backward a run (a `RunDir`) split on every microbatch: I measured, no
    B, and not run whole. A whole B there can only be priced as I + W, the split's own cost
    included (its stores, W's own call: on llama-tiny fp32 on CPU, 1.05-1.10x a whole backward).
    None on the known-cost model, whose I + W is its B by construction."""
    if run.config.model.kind == "synthetic":
        return []
    a = run.summary.measured_costs["action_s"]
    whole = set(whole_stages(run))
    split = {int(k[:-1]) for k in a if k[-1] == "I" and f"{k[:-1]}B" not in a}
    return sorted(split - whole)


def priced_split_note(path: str, stages: list[int], what: str, cfg, so: str = "") -> str:
    """The note where ``what`` (B's) on ``stages`` of the run at ``path`` (`split_only_stages`)
    are priced at the run's I + W (``so``: what follows from it), and the run that measures
    whole B's there (``cfg``: the run's config): its own config with 1F1B beside it, else a
    drain run, where drain changes the run's list."""
    from ppx.config.resolve import drain_would_change
    from ppx.plan.calibrate import beside_command

    beside = beside_command(path + "/config.yaml", cfg, whole=True)
    if beside:
        how = f"one run measures both, the run's own beside 1F1B: `{beside}`"
    elif cfg.train.split_backward == "drain":
        how = "train.split_backward=drain ran none there at this shape"
    elif drain_would_change(cfg):
        how = "a run with train.split_backward=drain measures both"
    else:  # (every W after its stage's last F already: drain would run what this run ran)
        how = "drain would keep every split at this shape: a run of pipeline.schedule=1f1b measures whole B's"
    return (
        f"note: {path} measured no whole B on {stage_list(stages)}: {what} there cost I + W, the split's own "
        f"cost included, where a whole backward costs less{so}; {how}"
    )


def require_backward(path: str, summary) -> None:
    """Fail where the run at ``path`` measured no backward: a forward-only run's are 0, not unknown."""
    if not measured_ops(summary) & {"B", "I"}:
        raise UserError(
            f"{path} measured no backward ({summary.schedule} trains nothing): take the costs from a run that trains"
        )


def not_in_a_run(option: str, path, what: str = "folder") -> None:
    """Fail where ``path`` (``what`` the option names: a folder, a file's path) is or lies in a
    run, or leads into one (`run_holding`): ppx never writes there."""
    from ppx.report.run_dir import run_holding

    run = run_holding(path)
    if run is not None:
        raise UserError(f"{option} {path} is inside the run {run}; ppx never writes into a run (give another {what})")


def empty_or_new(option: str, path) -> None:
    """Fail before any work where ``path`` (a folder the command makes) is not new or empty: a
    file, a folder holding anything (a file there would be replaced), a link to nothing."""
    out = Path(path)
    not_a_dangling_link(option, out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{option} {path} exists and is not empty; give a new folder")


def not_a_dangling_link(option: str, path) -> None:
    """Fail where ``path`` is a link to nothing: making a folder there fails ("File exists")."""
    if Path(path).is_symlink() and not Path(path).exists():
        raise UserError(f"{option} {path} is a link to {os.readlink(path)}, which does not exist; give a new folder")


def output_path(option: str, path, picture: bool = False) -> None:
    """Fail before any work when ``path`` (an output file; ``picture``: one matplotlib draws,
    named by its format) could not be written, or would be written into a run."""
    if path is None:
        return
    if Path(path).is_dir():
        raise UserError(f"{option} {path} is a folder; give a file's path")
    if picture:
        from matplotlib.backend_bases import FigureCanvasBase

        kinds = FigureCanvasBase.get_supported_filetypes()
        if Path(path).suffix.lower().lstrip(".") not in kinds:
            raise UserError(f"{option} {path}: name a picture file, e.g. .png (or {', '.join(sorted(kinds))})")
    folder = Path(path).parent
    not_in_a_run(option, path, "path")  # (the file's folder, or where a link named so leads)
    if not folder.is_dir():
        raise UserError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{option} {path}: folder {folder} is not writable")


def wrote(out: Path) -> None:
    names = ("compare.md", "compare.json", "paired.json", "compare.png", "bubble.png")
    files = [out / f for f in names if (out / f).exists()]
    print("ppx: wrote " + ", ".join(map(str, files)))


def first_step_note(path: str, cfg) -> str | None:
    """A note where a run's measured costs (its last ``instrument.timeline_steps`` steps)
    include its first step, whose first sends and calls (connections, allocations) are not
    the steady ones a plan or a simulation means: a short run's hand-off came out 12x its
    steady figure and reordered a plan's candidates."""
    steps, kept = cfg.train.steps, cfg.instrument.timeline_steps
    if steps > kept:
        return None
    return (
        f"note: {path}'s costs include its first step (train.steps={steps}, instrument.timeline_steps={kept}): its "
        "first sends and calls weigh in them; a run of more steps than instrument.timeline_steps measures steady ones"
    )


def noisy_run_note(path: str, step_times: list[float]) -> str | None:
    """`ppx.measure.metrics.noisy_note` of the run at ``path``."""
    from ppx.measure.metrics import noisy_note

    return noisy_note(str(path), step_times)


def drain_list(sched, transport: str = "nccl"):
    """``--drain``: ``sched`` as ``train.split_backward=drain`` runs it (`ppx.schedules.drained`,
    placed for ``transport``); a list that splits no backward refused in one line."""
    from ppx.schedules import drained

    if not sched.splits_backward:
        raise UserError(f"--drain: {sched.name} splits no backward into I and W")
    return drained(sched, transport)
