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
    """`beside_entries` as the command that runs them beside the run's own config."""
    from ppx.plan.paired_command import paired_value

    entries = beside_entries(cfg, whole, apart)
    if entries is None:
        return None
    return f"ppx run {shlex.quote(config_yaml)} 'run.paired={paired_value(entries)}' run.dir=null"


def beside_entries(cfg, whole: bool = False, apart: bool = False) -> list[str] | None:
    """The entries of the one run that measures what a plan from a run of config ``cfg`` lacks: the run's own
    config, step by step beside 1F1B where it lacks whole B's (``whole``) and beside ZB-H1
    splitting every stage apart, as the plan's commands split (`commands_way`; store under
    auto), where it lacks I and W (``apart``); interleaved 1F1B and interleaved zero bubble at
    the run's stages per rank for a run of several. A plan --from-run of it takes each from
    whichever ran it (`ppx.commands.run_costs`). None where ``run.paired`` cannot hold them (data
    parallel, torch's runtime, a shape those schedules refuse)."""
    import copy

    from omegaconf.errors import OmegaConfBaseException

    from ppx.config.paired import same_costs, variants
    from ppx.config.resolve import resolve_schedule
    from ppx.errors import UserError

    if not (whole or apart):
        return None
    try:
        sched = resolve_schedule(cfg)
    except (UserError, OSError, ValueError):  # (a CSV moved since the run)
        return None
    v = sched.num_stages // sched.num_ranks
    shape = "" if v == 1 or cfg.pipeline.virtual_stages == v else f" pipeline.virtual_stages={v}"
    way = commands_way(cfg)
    way = way if way in ("store", "graph") else calibration_way(cfg)
    entries = [("pipeline.schedule=1f1b" if v == 1 else "pipeline.schedule=interleaved_1f1b") + shape] if whole else []
    if apart:
        split = "pipeline.schedule=zb_h1" if v == 1 else "pipeline.schedule=interleaved_zb"
        entries.append(split + shape + (f" train.split_backward={way}" if way else ""))
    beside = copy.deepcopy(cfg)
    beside.run.paired = entries
    try:  # (each entry checked as ppx run checks it, and costing what the run does)
        if not all(same_costs(cfg, other) for _, other in variants(beside)):
            return None
    except (UserError, OmegaConfBaseException, OSError, ValueError):
        return None
    return entries


def stage_count_command(config_yaml: str, cfg, shown: list[tuple[str, int]]) -> str | None:
    """The run that prices candidates of more stages than a run of config ``cfg`` ran, as they
    run: its own config with each (candidate name, v) of ``shown`` beside it in ``run.paired``,
    after the run's own entries (an entry of another stage count lends all its actions to
    that count: `ppx.commands.run_costs`). None where ``run.paired`` cannot hold them."""
    import copy

    from omegaconf.errors import OmegaConfBaseException

    from ppx.config.paired import same_layer_costs, variants
    from ppx.errors import UserError
    from ppx.plan.builders import DRAIN, family_of
    from ppx.plan.paired_command import paired_value
    from ppx.schedules.registry import default_virtual

    entries = list(cfg.run.paired)
    new = []
    for name, v in shown:
        fam = family_of(name)
        entry = f"pipeline.schedule={fam}" + ("" if v == default_virtual(fam) else f" pipeline.virtual_stages={v}")
        entry += " train.split_backward=drain" if name.endswith(DRAIN) else ""
        if entry not in entries:
            entries.append(entry)
            new.append(entry)
    beside = copy.deepcopy(cfg)
    beside.run.paired = entries
    try:  # (each entry checked as ppx run checks it, and costing what the run does, layer for layer)
        if not new or not all(same_layer_costs(cfg, other) for e, other in variants(beside) if e in new):
            return None
    except (UserError, OmegaConfBaseException, OSError, ValueError):
        return None
    return f"ppx run {shlex.quote(config_yaml)} 'run.paired={paired_value(entries)}' run.dir=null"


def commands_way(cfg) -> str | None:
    """How the commands of a plan from a run of config ``cfg`` split a stage's backward: the
    run's ``train.split_backward`` where it is store or graph, else auto (a drain run's
    candidates run auto: `ppx.plan.howto.from_run_overrides`), which under torch's tracer keeps
    every graph; None where ppx's runtime chooses nothing (`calibration_way`: the known-cost
    model, torch's executor)."""
    way = calibration_way(cfg)
    if way is None:
        return None
    if cfg.train.split_backward in ("store", "graph"):
        return cfg.train.split_backward
    return "graph" if way == "graph" else "auto"


def runs_whole(cfg) -> bool:
    """Whether those commands run a stage whose every I its list follows at once by its W as
    one whole backward, in the I (ppx's runtime under auto)."""
    return calibration_way(cfg) is not None and cfg.train.split_backward in ("auto", "drain")


def split_calibration(config_yaml: str, way: str | None = None, paired: bool = False) -> str:
    """The run that measures I and W apart: the same config under ZB-H1 (it splits every
    backward), with ``train.split_backward=<way>`` (`calibration_way`) where given, and without
    the run's ``run.paired`` entries (``paired``: it had some)."""
    keys = "pipeline.schedule=zb_h1 pipeline.virtual_stages=null" + (f" train.split_backward={way}" if way else "")
    return f"ppx run {shlex.quote(config_yaml)} {keys}{' run.paired=[]' if paired else ''} run.dir=null"


def refused_split_note(
    from_run: str | None, skipped, whole: tuple[int, ...], cfg, ran_whole: tuple[int, ...] = ()
) -> str | None:
    """The note naming the split-backward schedules a plan refused for want of I and W costs
    (``whole``: the stages whose I and W no one measured apart; ``ran_whole``: those the run
    itself ran whole; ``cfg``: the run's config), and the run that measures them: the run's own
    beside ZB-H1 (`beside_command`), else ZB-H1 alone."""
    refused = sorted({s.schedule for s in skipped if s.reason.startswith(SPLIT_REASON)})
    if not from_run or not refused:
        return None
    if whole and set(whole) <= set(ran_whole):
        why = f"ran {stage_list(whole)} whole (each I followed at once by its W: one backward, in the I)"
    elif whole:
        why = f"has no I and W measured apart on {stage_list(whole)}, nor have its run.paired entries"
    else:
        why = "never split its backward"
    said = f"note: {from_run} {why}, so its I and W costs are unknown: {', '.join(refused)} not planned (costing W at 0 would rank them falsely first); "
    entry = stored_entry(from_run, cfg, whole)
    if entry:
        return (
            said + f"its entry {entry!r} stored {stage_list(whole)}, where the plan's commands (train.split_backward="
            "auto) keep the graph, the stores holding more; plan from a run that splits every stage the graph's "
            f"way: `{_graph_command(from_run + '/config.yaml', cfg)}`"
        )
    return said + f"measure them with `{split_command(from_run + '/config.yaml', cfg)}` and plan --from-run that run"


def stored_entry(run: str, cfg, stages) -> str | None:
    """The storing ZB-H1 entry (`beside_entries`') that the run ``run`` (of config ``cfg``)
    ran beside it already, where it stored one of ``stages`` with stores holding more than the
    graph: auto, which the plan's commands run, keeps the graph there, so that entry's I and
    W are not theirs, and no entry beside a run under auto measures them. None else."""
    from ppx.errors import UserError
    from ppx.report.run_dir import RunDir

    apart = beside_entries(cfg, apart=True)
    if not stages or not apart or commands_way(cfg) != "auto" or apart[-1] not in (cfg.run.paired or ()):
        return None
    try:
        row = (RunDir(run).raw_summary.get("paired") or {}).get(apart[-1]) or {}
    except UserError:
        return None
    ways = row.get("split_backward") or {}
    for stage in stages:
        info = ways.get(str(stage)) or {}
        if info.get("mode") == "store" and info.get("store_bytes", 0) > info.get("graph_bytes", 0):
            return apart[-1]
    return None


def measuring_command(run: str, cfg, stages=()) -> str:
    """The run that measures I and W apart on ``stages`` for the run ``run`` of config
    ``cfg``: `split_command`, or where the run's storing entry could not (`stored_entry`)
    `_graph_command`."""
    config_yaml = run + "/config.yaml"
    return _graph_command(config_yaml, cfg) if stored_entry(run, cfg, stages) else split_command(config_yaml, cfg)


def _graph_command(config_yaml: str, cfg) -> str:
    """The run of config ``cfg`` under ``train.split_backward=graph`` beside ZB-H1 the graph's
    way (and beside 1F1B where the run had that entry too), else ZB-H1 alone so: a plan from
    it runs its commands the graph's way, as measured."""
    import copy

    from ppx.plan.paired_command import paired_value

    graph = copy.deepcopy(cfg)
    graph.train.split_backward = "graph"
    whole = (beside_entries(cfg, whole=True) or [None])[0] in (cfg.run.paired or ())
    entries = beside_entries(graph, whole=whole, apart=True)
    if entries is None:
        return split_calibration(config_yaml, "graph", bool(cfg.run.paired))
    return (
        f"ppx run {shlex.quote(config_yaml)} train.split_backward=graph 'run.paired={paired_value(entries)}' "
        "run.dir=null"
    )


def split_command(config_yaml: str, cfg) -> str:
    """The run that measures I and W apart for a run of config ``cfg``: its own config with
    ZB-H1 beside it (`beside_command`), else ZB-H1 alone (`split_calibration`)."""
    return beside_command(config_yaml, cfg, apart=True) or split_calibration(
        config_yaml, calibration_way(cfg), bool(cfg.run.paired)
    )
