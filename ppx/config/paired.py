"""``run.paired``: other configs run step by step beside a run, in its processes. Each entry
is ``key=value`` overrides of the run's own config, space-separated
(``"pipeline.schedule=zb_h1 train.split_backward=drain"``), of the keys that change what a
step computes and how (``pipeline``, ``model``, ``train``), never of those that change the
job (``pipeline.stages``, ``parallel``, ``runtime``) or how long it runs (``train.steps``).
Both run on ppx's runtime, and beside a ``model.kind=module`` run (whose loss and data
functions are its module's, one per process) an entry keeps the run's model section.
Checked with the run's config, before any process starts."""

from __future__ import annotations

import copy
import shlex

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ppx.errors import UserError

SECTIONS = ("pipeline.", "model.", "train.")  # what an entry may change
FIXED = ("pipeline.stages", "train.steps", "model.preset")  # the job's shape and length; a preset's keys are the run's


def entry_overrides(entry: str) -> list[str]:
    """The ``key=value`` overrides of one ``run.paired`` entry; UserError for one that is not."""
    if not isinstance(entry, str):  # (OmegaConf keeps a mapping or list in a List[str] as it is)
        raise UserError(
            f"run.paired: {OmegaConf.to_container(entry) if OmegaConf.is_config(entry) else entry!r} is not a "
            "string of key=value overrides (write an entry as 'pipeline.schedule=zb_h1 train.split_backward=store')"
        )
    try:
        items = shlex.split(entry)
    except ValueError as e:
        raise UserError(f"run.paired: {entry!r}: {e}") from None
    if not items:
        raise UserError("run.paired: an entry is empty; give key=value overrides of the run's config")
    keys = [item.partition("=")[0].strip() for item in items]
    twice = sorted({k for k in keys if k and keys.count(k) > 1})
    if twice:
        raise UserError(f"run.paired: {entry!r} sets {twice[0]} twice (one value a key, in an entry)")
    for item in items:
        key = item.partition("=")[0].strip()
        if "=" not in item or not key:
            raise UserError(
                f"run.paired: {item!r} must look like key=value (an entry's overrides are split at spaces: "
                "no space around '=', and quote a list value: \"pipeline.layers_per_stage=[2,2]\")"
            )
        if not key.startswith(SECTIONS) or key in FIXED:
            raise UserError(
                f"run.paired: {key} cannot change beside the run (an entry changes pipeline.*, model.* or "
                f"train.* keys, but not {', '.join(FIXED)}: the job and its steps are the run's)"
            )
    return items


def variants(cfg) -> list[tuple[str, object]]:
    """(entry, its config) for each ``run.paired`` entry of the run config ``cfg``: the run's
    config with the entry's overrides, checked by the config's rules, and run as a pipeline of
    the same ranks; UserError (one line, naming the entry) otherwise."""
    from ppx.config.loading import _one_line
    from ppx.config.resolve import resolve_schedule
    from ppx.config.rules import check
    from ppx.schedules import registry

    if not cfg.run.paired:
        return []
    if cfg.parallel.data > 1:
        raise UserError("run.paired runs beside one pipeline: parallel.data must be 1")
    if registry.runs_on_torch(cfg.pipeline.schedule, cfg.pipeline.executor):
        raise UserError("run.paired runs on ppx's runtime: not beside torch's (pipeline.executor, torch_* schedules)")
    ranks = resolve_schedule(cfg).num_ranks
    twice = sorted({e for e in cfg.run.paired if list(cfg.run.paired).count(e) > 1})
    if twice:
        raise UserError(f"run.paired: {twice[0]!r} is given twice (each entry is one config, once)")
    out = []
    for entry in cfg.run.paired:
        overrides = entry_overrides(entry)
        try:
            other = OmegaConf.to_object(_with_entry(cfg, overrides))
        except OmegaConfBaseException as e:
            raise UserError(f"run.paired: {entry!r}: {_one_line(e)}") from None
        if "module" in (cfg.model.kind, other.model.kind) and other.model != cfg.model:
            raise UserError(
                f"run.paired: {entry!r} changes model.* beside a model.kind=module run: its module's loss and "
                "data functions are one per process, so an entry keeps the run's model section"
            )
        try:
            check(other)
        except UserError as e:
            raise UserError(f"run.paired: {entry!r}: {e}") from None
        if registry.runs_on_torch(other.pipeline.schedule, other.pipeline.executor):
            raise UserError(f"run.paired: {entry!r} runs on torch's runtime; an entry runs on ppx's")
        if resolve_schedule(other).num_ranks != ranks:
            raise UserError(f"run.paired: {entry!r} runs on other ranks than the run's {ranks}")
        same = next((e for e, o in out if same_run(o, other)), None)
        if same is not None:  # the same config spelled otherwise (two floors among them)
            raise UserError(f"run.paired: {entry!r} is the same config as {same!r} (each entry is one config, once)")
        out.append((entry, other))
    return out


def entry_config(cfg, entry: str):
    """The config (an object) entry ``entry`` of the run config ``cfg`` runs, unchecked (`variants`
    checks); UserError or an OmegaConf error for one that is not."""
    return OmegaConf.to_object(_with_entry(cfg, entry_overrides(entry)))


def entry_units(cfg, entry: str) -> list[int] | None:
    """The model units per stage entry ``entry`` of the run config ``cfg`` ran (its split, as
    `ppx.models.split_of` makes it from the entry's config), or None where it cannot be had here."""
    from ppx import models
    from ppx.config.resolve import resolve_schedule

    try:
        other = entry_config(cfg, entry)
        return [len(r) for r in models.split_of(other, resolve_schedule(other).num_stages)]
    except (UserError, OmegaConfBaseException):
        return None


def floors(cfg) -> list[str]:
    """The entries of ``run.paired`` that set only values the run already has: the run's own
    config beside itself, whose ratio is the machine's floor (how far from 1 two copies of one
    config land in this job)."""
    conf = OmegaConf.structured(cfg)
    absent = object()  # a key the run has not (a new key of a dict, model.hf_overrides'): never a floor's
    run = None
    out = []
    for entry in cfg.run.paired:
        items = entry_overrides(entry)
        other = _with_entry(cfg, items)
        keys = [item.partition("=")[0].strip() for item in items]
        if all(OmegaConf.select(other, k) == OmegaConf.select(conf, k, default=absent) for k in keys):
            out.append(entry)
            continue
        try:  # the run's own list spelled otherwise (its default v given, its drained list as a CSV)
            run = run or OmegaConf.to_object(_with_entry(cfg, []))
            if same_run(run, OmegaConf.to_object(other)):
                out.append(entry)
        except (UserError, OmegaConfBaseException):
            pass
    return out


def same_run(a, b) -> bool:
    """Whether configs ``a`` and ``b`` run the same: equal, or equal but for how they name the
    schedule (a family or its CSV, ``pipeline.virtual_stages`` given or left to the family's
    default, ``train.split_backward`` drain or auto over a list drained already) where the two
    resolve to the same lists on the same ranks."""
    from ppx.config.resolve import resolve_schedule

    if a == b:
        return True
    if _named_apart(a) != _named_apart(b):
        return False
    x, y = resolve_schedule(a), resolve_schedule(b)
    return x.actions == y.actions and list(x.stage_to_rank) == list(y.stage_to_rank)


def same_work(a, b) -> bool:
    """Whether configs ``a`` and ``b`` run the same work in the same order: `same_run`, or the
    same but for where their lists place sends and receives (a list and a CSV of its compute
    order holding sends of its own: they measure alike)."""
    from ppx.config.resolve import resolve_schedule
    from ppx.schedules.ir.structure import same_compute

    if same_run(a, b):
        return True
    if _named_apart(a) != _named_apart(b):
        return False
    return same_compute(resolve_schedule(a), resolve_schedule(b))


def same_costs(a, b) -> bool:
    """Whether configs ``a`` and ``b`` cost the same, action for action: equal but for their
    schedule (its name, v, CSV) and ``train.split_backward``, over as many stages (so each
    stage holds the same layers). What one measured beside the other prices the other's
    actions (`ppx.commands.run_costs`)."""
    from ppx.config.resolve import resolve_schedule

    return same_layer_costs(a, b) and resolve_schedule(a).num_stages == resolve_schedule(b).num_stages


def same_layer_costs(a, b) -> bool:
    """Whether configs ``a`` and ``b`` cost the same layer for layer: `same_costs` but over any
    number of stages (an entry of v=2 beside a run of v=1). What one measured prices the other's
    candidates at its stage count (`ppx.commands.run_costs`, ``at_stages``)."""
    x, y = _named_apart(a), _named_apart(b)
    x.train.split_backward = y.train.split_backward = "auto"
    return (x.pipeline, x.model, x.train) == (y.pipeline, y.model, y.train)  # (what an entry may change)


def _named_apart(cfg):
    """``cfg`` (a config object) without how it names its schedule (`same_run`)."""
    out = copy.deepcopy(cfg)
    out.pipeline.schedule, out.pipeline.virtual_stages = "", None
    if out.train.split_backward == "drain":
        out.train.split_backward = "auto"
    return out


def _with_entry(cfg, overrides: list[str]):
    """The run config ``cfg`` (as an OmegaConf config) with an entry's ``overrides`` on top,
    no run.paired of its own and no runtime.inject_fault (a fault fires in the run's own
    actions, never an entry's), unchecked."""
    from ppx.config.loading import merge_overrides

    conf = _over_the_schema(cfg)
    merge_overrides(conf, [*overrides, "run.paired=[]", "runtime.inject_fault=null"])
    return conf


_BUILT: list = []  # (a run config's repr, it as an OmegaConf config): the last few `_over_the_schema` built


def _over_the_schema(cfg):
    """The config object ``cfg`` as an OmegaConf config over the schema (a new one, the
    caller's to change): a copy of the one built for an equal config before, where there is one
    (`OmegaConf.structured` walks every dataclass, about 80 ms; a copy takes 10; a plan asks for
    one run config's entries a few dozen times)."""
    from ppx.config.loading import _schema

    key = repr(cfg)  # (every field's value and type: 1, 1.0 and True apart, which == is not)
    for seen, conf in _BUILT:
        if seen == key:
            return copy.deepcopy(conf)
    conf = OmegaConf.merge(_schema(), OmegaConf.structured(cfg))
    _BUILT[:] = [(key, conf), *_BUILT[:3]]
    return copy.deepcopy(conf)
