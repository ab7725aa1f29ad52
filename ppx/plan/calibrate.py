"""Where a plan's figures for this machine come from, and what it refuses without them: the
calibration run a plan from flags points to (its runtime overhead per action and hand-off
time, which ``--calibrate`` runs and keeps, and ``--machine-from`` reads from any run), and
the split-backward candidates a ``--from-run`` plan refuses when the run never split its
backward (its I and W costs are unknown, not 0)."""

from __future__ import annotations

import shlex

from ppx.plan.space import SPLIT_REASON
from ppx.units import stage_list

MAX_RANKS = 8  # a calibration runs p CPU ranks on this machine: more is a cluster's p


def calibration_command(p: int) -> str:
    """A short known-cost run at p ranks that measures this machine's overhead and hand-offs."""
    return (
        f"ppx run 1f1b_2cpu model.kind=synthetic pipeline.stages={p} pipeline.microbatches=8 "
        "train.batch_size=8 train.steps=8 model.fwd_ms=5 model.bwd_ms=5 model.wgrad_ms=5"
    )


def calibration_hint(p: int) -> str:
    """How to give a plan from flags at (largest) ``p`` ranks this machine's figures: up to
    ``MAX_RANKS`` ppx measures them itself; a cluster's p needs a run of that cluster."""
    if p > MAX_RANKS:
        return (
            f"a run spends more: give the figures of the machine it runs on with --machine-from <a run directory "
            f"of {p} ranks there> (or --overhead-ms and --p2p-ms)"
        )
    return (
        "a run spends more on this machine: plan again with --calibrate (ppx measures its figures once, with `"
        + calibration_command(p)
        + "`, and keeps them), or --machine-from <a run directory of that command>"
    )


def calibration_way(cfg) -> str | None:
    """The ``train.split_backward`` a run of config ``cfg`` under ZB-H1 needs to measure every
    stage's I and W apart: under auto ppx's runtime runs a stage whole where each of its I's is
    followed at once by its W (ZB-H1's first), so ``store`` where stages have Linear layers to
    store, ``graph`` under torch's tracer (its GraphModules store nothing); None for the
    known-cost model and torch's executor, which run no stage whole."""
    if cfg.model.kind == "synthetic" or cfg.pipeline.executor == "torch":
        return None
    return "graph" if cfg.pipeline.split == "tracer" else "store"


def beside_command(config_yaml: str, cfg, whole: bool = False, apart: bool = False) -> str | None:
    """The one run that measures what a plan from a run of config ``cfg`` lacks: the run's own
    config, with 1F1B beside it step by step where it lacks whole B's (``whole``) and ZB-H1
    that splits every stage apart (`calibration_way`) where it lacks I and W (``apart``); a
    plan --from-run of it takes each from whichever ran it (`ppx.commands.run_costs`). None
    where ``run.paired`` cannot hold them: data parallel, torch's runtime, or stages that are
    not one a rank (1F1B's and ZB-H1's are)."""
    from ppx.config.resolve import resolve_schedule
    from ppx.errors import UserError
    from ppx.plan.paired_command import paired_value
    from ppx.schedules import registry

    if cfg.parallel.data > 1 or registry.runs_on_torch(cfg.pipeline.schedule, cfg.pipeline.executor):
        return None
    try:
        sched = resolve_schedule(cfg)
    except (UserError, OSError, ValueError):  # (a CSV moved since the run)
        return None
    if sched.num_stages != sched.num_ranks:
        return None
    way = calibration_way(cfg)
    entries = (["pipeline.schedule=1f1b"] if whole else []) + (
        ["pipeline.schedule=zb_h1" + (f" train.split_backward={way}" if way else "")] if apart else []
    )
    if not entries:
        return None
    return f"ppx run {shlex.quote(config_yaml)} 'run.paired={paired_value(entries)}' run.dir=null"


def split_calibration(config_yaml: str, way: str | None = None, paired: bool = False) -> str:
    """The run that measures I and W apart: the same config under ZB-H1 (it splits every
    backward), with ``train.split_backward=<way>`` (`calibration_way`) where given, and without
    the run's ``run.paired`` entries (``paired``: it had some)."""
    keys = "pipeline.schedule=zb_h1 pipeline.virtual_stages=null" + (f" train.split_backward={way}" if way else "")
    return f"ppx run {shlex.quote(config_yaml)} {keys}{' run.paired=[]' if paired else ''} run.dir=null"


def refused_split_note(from_run: str | None, skipped, whole: tuple[int, ...], cfg) -> str | None:
    """The note naming the split-backward schedules a plan refused for want of I and W costs
    (``whole``: the run's stages that ran their backward whole; ``cfg``: the run's config), and
    the run that measures them: the run's own beside ZB-H1 (`beside_command`), else ZB-H1 alone."""
    refused = sorted({s.schedule for s in skipped if s.reason.startswith(SPLIT_REASON)})
    if not from_run or not refused:
        return None
    why = (
        f"ran {stage_list(whole)} whole (each I followed at once by its W: one backward, in the I)"
        if whole
        else "never split its backward"
    )
    return (
        f"note: {from_run} {why}, so its I and W costs are unknown: "
        f"{', '.join(refused)} not planned (costing W at 0 would rank them falsely first); measure them with "
        f"`{split_command(from_run + '/config.yaml', cfg)}` and plan --from-run that run"
    )


def split_command(config_yaml: str, cfg) -> str:
    """The run that measures I and W apart for a run of config ``cfg``: its own config with
    ZB-H1 beside it (`beside_command`), else ZB-H1 alone (`split_calibration`)."""
    return beside_command(config_yaml, cfg, apart=True) or split_calibration(
        config_yaml, calibration_way(cfg), bool(cfg.run.paired)
    )
