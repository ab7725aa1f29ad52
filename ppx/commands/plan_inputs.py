"""`ppx plan`'s command line -> `PlanInputs` and the space to search: costs from flags or a
run directory, sizes, lists of p, m and v; every bad value a one-line UserError."""

from __future__ import annotations

from dataclasses import replace

from omegaconf.errors import OmegaConfBaseException

from ppx.commands.common import measured_run, ms_list
from ppx.commands.run_costs import run_costs_at
from ppx.errors import UserError, said
from ppx.plan.calibrate import runs_whole
from ppx.plan.inputs import PlanInputs, shared_of_run
from ppx.plan.sizes import parse_budget, parse_sizes
from ppx.schedules.registry import MAX_STAGE_MICROBATCHES

COST_FLAGS = ("fwd_ms", "bwd_ms", "wgrad_ms", "p2p_ms", "overhead_ms", "act_bytes", "machine_from", "calibrate")


def flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def ints(option: str, text: str | None) -> list[int] | None:
    """'4' or '2,4,8' -> positive integers (None stays None)."""
    if text is None:
        return None
    try:
        values = [int(x) for x in str(text).split(",")]
    except ValueError:
        raise UserError(f"{option} {text}: give whole numbers, one or a list (e.g. 4 or 2,4,8)") from None
    if any(v < 1 for v in values):
        raise UserError(f"{option} {text}: every value must be >= 1")
    return list(dict.fromkeys(values))


def _ms_float(option: str, value: float | None) -> float:
    if value is not None and value < 0:
        raise UserError(f"{option} must be >= 0, got {value:g}")
    return (value or 0.0) / 1e3


def _sized(option: str, text: str | None, units: int, per: str) -> tuple[float, ...] | None:
    """A size list of one value (repeated) or one per unit."""
    if text is None:
        return None
    values = parse_sizes(option, text)
    if len(values) not in (1, units):
        raise UserError(f"{option} has {len(values)} values: give one, or one per {per} ({units})")
    return tuple(values * units if len(values) == 1 else values)


def _units(args) -> int:
    """Layers (--per-layer) or stages the cost lists are for."""
    lengths = {
        flag(a): len(str(getattr(args, a)).split(","))
        for a in ("fwd_ms", "bwd_ms", "wgrad_ms", "act_bytes", "param_bytes")
        if getattr(args, a) is not None
    }
    many = {n for n in lengths.values() if n > 1}
    if len(many) > 1:
        raise UserError(f"cost lists of different lengths: {', '.join(f'{k} {n}' for k, n in lengths.items())}")
    if args.per_layer:
        if not many:
            raise UserError("--per-layer: give one value per layer in at least one list (e.g. --fwd-ms 1,1,1,1)")
        return many.pop()
    stages = ints("--stages", args.stages)
    if stages is not None and len(stages) > 1:
        raise UserError("--stages takes one p with per-stage costs; give --per-layer costs to search p")
    if stages and stages[0] > MAX_STAGE_MICROBATCHES:  # (before a cost list of one value per stage is made)
        raise UserError(
            f"--stages {stages[0]}: ppx builds lists of at most {MAX_STAGE_MICROBATCHES} stage-microbatches, so of "
            f"at most {MAX_STAGE_MICROBATCHES} stages"
        )
    if many and stages and stages[0] != min(many):
        raise UserError(f"--stages {stages[0]} but the cost lists have {min(many)} values (one per stage)")
    return stages[0] if stages else many.pop() if many else 4


def from_flags(args) -> tuple[PlanInputs, list[int], list[int]]:
    """Inputs from the cost flags, and the p and m to search."""
    if args.fwd_ms is None or args.bwd_ms is None:
        raise UserError("give costs: --from-run DIR, or --fwd-ms and --bwd-ms (--wgrad-ms, --p2p-ms optional)")
    n = _units(args)
    per = "layer" if args.per_layer else "stage"
    ps = (ints("--stages", args.stages) or [4]) if args.per_layer else [n]
    _check_machine_flags(args, max(ps))
    inputs = PlanInputs(
        fwd_s=tuple(ms_list("--fwd-ms", args.fwd_ms, n)),
        bwd_s=tuple(ms_list("--bwd-ms", args.bwd_ms, n)),
        wgrad_s=tuple(ms_list("--wgrad-ms", args.wgrad_ms or "0", n)),
        per_layer=args.per_layer,
        stages=None if args.per_layer else n,
        act_bytes=_sized("--act-bytes", args.act_bytes, n, per),
        param_bytes=_sized("--param-bytes", args.param_bytes, n, per),
        budget_bytes=budget(args),
        p2p_s=_ms_float("--p2p-ms", args.p2p_ms),
        overhead_s=_ms_float("--overhead-ms", args.overhead_ms),
        transport=args.transport or "nccl",
        rank_by=getattr(args, "rank_by", "sync"),
    )
    if not any(inputs.fwd_s + inputs.bwd_s + inputs.wgrad_s):
        raise UserError("--fwd-ms, --bwd-ms and --wgrad-ms are all 0: a step of no work has no throughput to rank")
    if args.machine_from:
        inputs = _with_machine(args, inputs, args.machine_from, args.machine_from)
    too_many = [p for p in ps if p > n] if args.per_layer else []
    if too_many:
        raise UserError(f"--stages {too_many[0]} but the costs are of {n} layers: every stage needs at least one")
    return inputs, ps, ints("--microbatches", args.microbatches) or [8]


def from_run(args) -> tuple[PlanInputs, list[int], list[int], str]:
    """Inputs measured in the run ``--from-run``, its p and the m to search, and the run's
    config (the experiment to run the best with)."""
    from ppx import models
    from ppx.measure.prediction import costs_from, transport_of
    from ppx.plan.unit_weights import unit_weights

    given = [flag(a) for a in COST_FLAGS if a != "p2p_ms" and getattr(args, a) is not None]
    given += ["--per-layer"] if args.per_layer else []
    if given:
        raise UserError(f"--from-run takes the run's costs; leave out {', '.join(given)}")
    run, s = measured_run(args.from_run)
    p = s.world_size
    if args.p2p_ms is not None and p > 1:  # (one rank hands nothing to another: the flag prices what it did not run)
        raise UserError(f"--from-run {args.from_run} measured its hand-offs between {p} ranks; leave out --p2p-ms")
    stages = s.stages or p * s.virtual
    costs = run_costs_at(str(run.path))  # the run's, and what its run.paired entries ran that it did not
    c = costs_from(costs.measured_costs, stages)
    samples = costs.cost_samples  # None for a run from before they were kept: the means
    if args.p2p_ms is not None:
        c = replace(c, p2p=_ms_float("--p2p-ms", args.p2p_ms))
        samples = samples and {**samples, "p2p_s": [c.p2p]}
    whole = costs.whole_stages  # I then W at once: one backward in the I, W not measured apart
    split_known = bool(costs.ops() & {"I", "W"})  # (a candidate splitting a whole stage apart: refused)
    saved = run.raw_summary.get("saved_bytes_per_microbatch")
    transport, lookahead = transport_of(run.config, (run.env or {}).get("backend", "gloo"))
    units = _run_units(run.config, stages, run.raw_summary.get("units_per_stage"))
    weights = unit_weights(run.config) if units else None
    fixed_by = _fixed_by(run.config)
    inputs = PlanInputs(
        fwd_s=tuple(c.fwd),
        bwd_s=tuple(c.bwd),
        wgrad_s=tuple(c.wgrad),
        stages=stages,
        act_bytes=tuple(float(b) for b in saved) if saved and len(saved) == stages else None,
        **shared_of_run(run.raw_summary.get("shared_with_stage_before"), stages),
        param_bytes=_sized("--param-bytes", args.param_bytes, stages, "stage")
        or _run_params(run, stages, units, weights),
        budget_bytes=budget(args),
        p2p_s=c.p2p,
        overhead_s=c.overhead,
        send_post_s=c.send_post,
        recv_post_s=c.recv_post,
        reduce_s=tuple(c.reduce) if run.config.parallel.data > 1 else None,
        transport=args.transport or transport,
        lookahead=lookahead,
        source=str(args.from_run),
        microbatch_size=s.batch_size // s.microbatches if s.batch_size else None,
        samples=samples,
        input_share=_shares(costs.input_share, stages),
        rank_by=getattr(args, "rank_by", "sync"),
        split_known=split_known,
        whole_stages=whole,
        max_stages=_max_stages(run.config),
        fixed_stages=stages if fixed_by else None,
        fixed_by=fixed_by or "pipeline.layers_per_stage",
        run_units=units,
        recompute=_recompute(run.config),
        unit_weights=weights,
        # what a candidate's command splits the units by (None: even; or a module not importable here)
        split_weights=models.counted_flops(run.config.model)
        if units and run.config.pipeline.balance == "flops"
        else None,
        no_cut_after=_integer_units(run.config) if units else (),
        whole_s=tuple(c.whole) if c.whole is not None else None,
        runs_whole=runs_whole(run.config),  # (as the candidates' commands run them)
        measured_at=costs.at_stages,  # entries of other stage counts: their candidates' costs
    )
    # other p than the run's: their stages regroup the run's units (`PlanInputs.parts`)
    ps = ints("--stages", args.stages) or [p]
    return inputs, ps, ints("--microbatches", args.microbatches) or [s.microbatches], str(run.path / "config.yaml")


def _integer_units(cfg) -> tuple[int, ...]:
    """The run's model units that hand on integers (your own module's, `unit_outputs`): a
    candidate's stage cannot begin after one (`module_spec`); () where there are none or the
    model cannot be run here."""
    from ppx import models

    kind = models.kind(cfg.model.kind)
    if not hasattr(kind, "unit_outputs"):
        return ()
    try:
        outputs = kind.unit_outputs(cfg.model, cfg.microbatch_size())
    except Exception:  # (a module not importable here: its candidates' commands say why they fail)
        return ()
    return tuple(u for u, (_, dtype) in enumerate(outputs) if not (dtype.is_floating_point or dtype.is_complex))


def _recompute(cfg) -> str:
    """The run's train.recompute as one mode ("none" where it gives one per stage: its own
    stage count only, `_fixed_by`)."""
    from ppx.models.costs import recompute_modes

    modes = recompute_modes(cfg.train.recompute, None)  # (a mode, or [mode], is one)
    return modes[0] if len(modes) == 1 else "none"


def _fixed_by(cfg) -> str | None:
    """The run's key that holds a value per stage, so that its config runs only at its own stage
    count (a candidate's command of another has as many values as the run had stages), or None."""
    if cfg.pipeline.layers_per_stage:
        return "pipeline.layers_per_stage"
    from ppx.models.costs import recompute_modes

    return "train.recompute" if len(recompute_modes(cfg.train.recompute, None)) > 1 else None


def _run_params(run, stages: int, units: tuple[int, ...] | None, weights) -> tuple[float, ...] | None:
    """Per stage of the run, what its parameters hold through a step (weights, gradients and
    the optimizer's state: `weights_held_bytes`) from each pipeline rank's ``param_bytes``
    the run measured (with ``instrument.memory``; else None); with several stages a rank, each
    rank's shared among its stages by their units' parameter bytes (``weights``, `UnitWeights`;
    else equally)."""
    from ppx.measure.weights_held import weights_held_bytes

    ranks = [r.get("param_bytes") for r in run.raw_summary.get("ranks") or []]
    if not ranks or None in ranks:
        return None
    held = [weights_held_bytes(b, run.config.train.optimizer) for b in ranks]
    # the run's own placement (a CSV may put stage 0 on rank 1), else, one stage a rank, stage s on rank s
    owner = _stage_ranks(run.config, stages, len(held)) or (list(range(stages)) if len(held) == stages else None)
    if owner is None:  # (the run's list not to be had again: the ranks' total, by the same shares)
        owner, held = [0] * stages, [sum(held)]
    per = [1.0] * stages
    if weights is not None and units is not None:
        starts = [sum(units[:s]) for s in range(stages)]
        per = [sum(weights.of_stage(range(a, a + n), "params")) for a, n in zip(starts, units)]
    out = []
    for s in range(stages):
        mine = [t for t in range(stages) if owner[t] == owner[s]]
        whole = sum(per[t] for t in mine)
        out.append(held[owner[s]] * (per[s] / whole if whole else 1 / len(mine)))
    return tuple(out)


def _stage_ranks(cfg, stages: int, ranks: int) -> list[int] | None:
    """The run's stage -> pipeline rank (its list as its config builds it), or None where it
    cannot be had again (a CSV moved since) or does not fit."""
    import csv

    from ppx.config import resolve_schedule

    try:
        owner = list(resolve_schedule(cfg).stage_to_rank)
    except (UserError, OmegaConfBaseException, OSError, ValueError, csv.Error):
        return None
    return owner if len(owner) == stages and max(owner) < ranks else None


def _max_stages(cfg) -> int | None:
    """The most stages the run's model splits into (its units), or None for the known-cost
    model at per-stage costs (a plan's command raises its layers)."""
    from ppx.models import unit_count

    if cfg.model.kind == "synthetic" and cfg.model.cost_per == "stage":
        return None
    return unit_count(cfg.model)


def _run_units(cfg, stages: int, ran=None) -> tuple[int, ...] | None:
    """The model units (blocks, and llama's embedding and head) in each of the run's stages,
    which a candidate's stages regroup as its command splits them: as the run's summary.json
    says it ran them (``ran``, ``units_per_stage``), else as its config splits them now; None
    for the known-cost model at per-stage costs (a plan's command gives each of its stages its
    share of them)."""
    from ppx.models import split_of, unit_count

    if cfg.model.kind == "synthetic" and cfg.model.cost_per == "stage":
        return None
    if ran and len(ran) == stages and sum(ran) == unit_count(cfg.model):  # (a split made by older code too)
        return tuple(int(n) for n in ran)
    return tuple(len(r) for r in split_of(cfg, stages))


def _check_machine_flags(args, p: int) -> None:
    """``--machine-from`` and ``--calibrate`` each give this machine's overhead and hand-off:
    neither with the other, nor with the flags for them; a calibration runs p ranks here."""
    calibrate = getattr(args, "calibrate", None)
    given = getattr(args, "machine_from", None)
    if not calibrate and not given:
        return
    clash = [flag(a) for a in ("p2p_ms", "overhead_ms") if getattr(args, a) is not None]
    clash += ["--machine-from"] if calibrate and given else []
    which = "--calibrate" if calibrate else "--machine-from"
    if clash:
        raise UserError(f"{which} gives this machine's overhead and hand-off; leave out {', '.join(clash)}")
    if calibrate:
        from ppx.plan.calibrate import MAX_RANKS

        if p > MAX_RANKS:
            raise UserError(
                f"--calibrate measures this machine with p CPU ranks; p={p} is a cluster's: give "
                "--machine-from a run directory of that cluster instead"
            )


def calibrated(args, inputs: PlanInputs, ps: list[int]) -> tuple[PlanInputs, str | None]:
    """``inputs`` with this machine's figures from its calibration run at the largest p: with
    ``--calibrate``, the newest kept or one run now; without it, and without any other source
    of those figures (``--machine-from``, ``--p2p-ms``, ``--overhead-ms``, ``--transport``: a
    plan for another machine), the newest one an earlier ``--calibrate`` kept, if any; and a
    note when a kept one could not be read (then passed over). Called after every other check."""
    from ppx.commands.calibration import calibrated_run, completed, measured_at
    from ppx.plan.calibrate import MAX_RANKS

    p = max(ps)
    if getattr(args, "calibrate", None):
        run_dir, now = calibrated_run(p, args.calibrate)
        when = f"{'measured now' if now else 'measured'} {measured_at(run_dir)}"
        try:
            return _with_machine(args, inputs, str(run_dir), f"this machine's calibration {run_dir}, {when}"), None
        except _UNREADABLE as e:
            raise UserError(f"--calibrate: {run_dir} cannot be read ({said(e)}); measure again: --calibrate new") from e
    given = [args.machine_from, args.p2p_ms, args.overhead_ms, args.transport]
    kept = completed(p) if p <= MAX_RANKS and all(x is None for x in given) else None
    if kept is None:
        return inputs, None
    source = (
        f"this machine's calibration {kept}, measured {measured_at(kept)}, kept by an earlier --calibrate "
        "(--overhead-ms 0 --p2p-ms 0 to plan without)"
    )
    try:
        return _with_machine(args, inputs, str(kept), source), None
    except _UNREADABLE as e:  # a kept run of an older ppx, say: planned without it, and said so
        return (
            inputs,
            f"note: the kept calibration {kept} cannot be read ({said(e)}); measure again: --calibrate new",
        )


# what reading a kept calibration run can raise: a missing file, a config of another ppx
_UNREADABLE = (UserError, OmegaConfBaseException, OSError, KeyError, ValueError, TypeError)


def _with_machine(args, inputs: PlanInputs, run_dir: str, source: str) -> PlanInputs:
    """``inputs`` with this machine's runtime figures measured in the run ``run_dir``: its
    overhead per action, hand-off and posting times, transport (unless --transport) and
    receive lookahead."""
    from ppx.measure.prediction import costs_from, transport_of

    run, s = measured_run(run_dir, backward=False)  # (its runtime figures only)
    c = costs_from(s.measured_costs, s.stages or s.world_size)
    transport, lookahead = transport_of(run.config, (run.env or {}).get("backend", "gloo"))
    return replace(
        inputs,
        p2p_s=c.p2p,
        overhead_s=c.overhead + _excess(run.config, s),
        send_post_s=c.send_post,
        recv_post_s=c.recv_post,
        transport=args.transport or transport,
        lookahead=lookahead,
        source=f"flags; runtime figures from {source}",
    )


def _excess(cfg, s) -> float:
    """On the known-cost model, what an action took beyond its configured cost, on average (its
    sleep's overshoot on this machine): a plan from flags gives the configured costs, so this
    is the runtime's time per action too. 0 for other models (their costs are the measured)."""
    if cfg.model.kind != "synthetic":
        return 0.0
    from statistics import fmean

    from ppx.models.costs import stage_costs_ms

    n = s.stages or s.world_size
    fwd, bwd, wgrad = stage_costs_ms(cfg.model, n, cfg.pipeline.layers_per_stage)
    a = s.measured_costs["action_s"]
    want = {"F": fwd, "I": bwd, "W": wgrad, "B": [b + w for b, w in zip(bwd, wgrad)]}
    over = [a[f"{st}{op}"] - want[op][st] / 1e3 for st in range(n) for op in want if f"{st}{op}" in a]
    return max(0.0, fmean(over)) if over else 0.0


def _shares(values, stages: int) -> tuple[float, ...] | None:
    """The run's measured share of saved bytes each stage's I frees (a split backward that
    stores: `ppx.engine.weight_store`; below 0 where the I adds, re-running a recomputed
    forward), or None (I frees nothing)."""
    return tuple(float(v) for v in values) if values and len(values) == stages and any(values) else None


def budget(args) -> float | None:
    return parse_budget("--mem-budget", args.mem_budget)
