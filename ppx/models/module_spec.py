"""``model.kind=module``: your own nn.Module by import path, and how it splits, checked before
any process starts (imports torch: only for this kind).

``model.module=package.module:function`` names a function that takes the config's model
section and returns the model. Its units (``model.units``: dotted submodule names; a ModuleList,
ModuleDict or Sequential stands for its children; none given: an nn.Sequential's own children) are what
its forward calls in turn: the split puts whole units on stages, and every parameter must
belong to exactly one unit, or be shared by units on purpose (a tied weight: its copies'
gradients are summed across stages, `ppx.engine.tied`). ``model.split_points`` names the units
where stages begin instead of ``pipeline.layers_per_stage``."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from ppx.errors import UserError, said, said_where


def load_function(path: str, key: str = "model.module") -> Callable:
    """The function ``package.module:function`` names (the current directory importable)."""
    if not path or path.count(":") != 1 or not all(path.split(":")):
        raise UserError(f"{key}={path!r} must look like package.module:function")
    name, attr = path.split(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if "/" in name or name.endswith(".py"):
            raise UserError(
                f"{key}={path}: give the module's import path (package.module:function, dots, no .py), not a "
                "file's; ppx imports it from the current directory or PYTHONPATH"
            ) from None
        # (the module itself, or a package on its path: not something it imports)
        ours = e.name is not None and (name == e.name or name.startswith(e.name + "."))
        where = f" (ppx imports it from the current directory, {Path.cwd()}, or PYTHONPATH)" if ours else ""
        raise UserError(f"{key}={path}: cannot import {name}: {said(e)}{where}") from None
    except Exception as e:
        raise UserError(f"{key}={path}: cannot import {name}: {said(e)}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise UserError(f"{key}={path}: {name} has no function {attr}")
    return fn


_SECTIONS: dict = {}  # id(model) -> (model, its repr, its DictConfig): one per resolved config


def section(model):
    """The model section as your functions get it: an OmegaConf DictConfig (``model.args.width``
    and ``model.args.get("width", 32)`` both read your keys), whether ppx holds the loading
    config (a DictConfig already) or the resolved dataclass (made once per config object)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(model, DictConfig):
        return model
    now = repr(model)  # (its values: a section changed since is made again)
    got = _SECTIONS.get(id(model))
    if got is None or got[0] is not model or got[1] != now:
        try:
            got = _SECTIONS[id(model)] = (model, now, OmegaConf.structured(model))
        except Exception as e:  # a value OmegaConf cannot hold (a config made in code)
            raise UserError(f"model: cannot hand the model section to model.module: {said(e)}") from None
    return got[2]


def build(model):
    """The user's model (the config's model section in, an nn.Module out). The function gets
    the section as an OmegaConf DictConfig, whatever holds it here (the loading config, or the
    resolved dataclass): ``model.args.width`` and ``model.args.get("width", 32)`` both read
    its own keys."""
    from torch import nn

    fn = load_function(model.module)
    try:
        got = fn(section(model))
    except UserError:
        raise
    except Exception as e:
        how = (
            " (ppx called the class with the model section: name a function that builds it)"
            if isinstance(fn, type)
            else ""
        )
        raise UserError(f"model.module={model.module} raised {said_where(e)}{how}") from None
    if not isinstance(got, nn.Module):
        raise UserError(f"model.module={model.module} returned {type(got).__name__}, not an nn.Module")
    return got


def units(model, module) -> list[str]:
    """The unit names of ``module`` (``model.units`` expanded), checked: each a submodule, none
    inside another, every parameter in one (or shared between units: tied)."""
    from torch import nn

    given = list(model.units) if model.units else None
    if given is None:
        if not isinstance(module, nn.Sequential):
            raise UserError(
                f"model.units: {type(module).__name__} is not an nn.Sequential; name the submodules its forward "
                "calls in turn (e.g. model.units=[embed,blocks,head])"
            )
    subs = dict(module.named_modules())
    names = [n for n, _ in module.named_children()] if given is None else []  # a Sequential's children, as they are
    for name in given or ():
        if name not in subs or not name:
            raise UserError(f"model.units: {name!r} is not a submodule of {type(module).__name__}")
        m = subs[name]
        if isinstance(m, (nn.ModuleList, nn.ModuleDict)) and not len(m):
            raise UserError(f"model.units: {name} is an empty {type(m).__name__}: no unit to run")
        if isinstance(m, (nn.ModuleList, nn.ModuleDict, nn.Sequential)) and len(m):
            names += [f"{name}.{child}" for child, _ in m.named_children()]  # (a ModuleDict's in its order)
        else:
            names.append(name)
    for name in names:
        if getattr(type(subs[name]), "forward", None) is getattr(nn.Module, "forward", None):
            raise UserError(
                f"model.units: {name} ({type(subs[name]).__name__}) has no forward of its own, and ppx runs each unit; "
                "name the submodules your forward calls in it"
            )
    for a in names:
        inner = [b for b in names if b != a and b.startswith(a + ".")]
        if inner or names.count(a) > 1:
            raise UserError(f"model.units: {a} is named twice or holds {inner[0] if inner else a}")
    owner = {}
    for k, name in enumerate(names):
        for p in subs[name].parameters():
            owner.setdefault(id(p), []).append(k)
    loose = [n for n, p in module.named_parameters() if id(p) not in owner]
    if loose:
        raise UserError(f"model.units do not cover the module: {', '.join(loose[:3])} belong to no unit")
    return names


def described(model) -> tuple:
    """(the model built on the meta device, its unit names): what the checks and the split read.
    A build that meta cannot run (one that reads a value: ``.item()``, ``float(w.max())``, which
    fails in words that name meta) is built on the CPU and moved there."""
    import torch

    try:
        with torch.device("meta"):
            module = build(model)
    except UserError as e:
        if not meta_refused(e.__context__):  # (what the build raised: `build` says it, from None)
            raise
        module = build(model).to("meta")
    return module, units(model, module)


def meta_refused(e: BaseException | None) -> bool:
    """Whether ``e`` is the meta device's refusal of work it cannot do without values (an op
    with no meta kernel, ``.item()``, a CPU tensor mixed in): the words name meta."""
    return isinstance(e, NotImplementedError) or "meta" in str(e).lower()


def check_split(cfg, num_stages: int, training: bool) -> None:
    """In training, each stage but the first of the split into ``num_stages`` (the schedule's:
    a CSV's own count) begins with a unit handed floats: its input's gradient goes back to the
    stage before (a unit handing on integers, indices or token ids, stays inside a stage)."""
    from ppx import models
    from ppx.models.module_chain import unit_shapes

    if not training:
        return
    m = cfg.model
    mbs = cfg.microbatch_size()
    shapes = unit_shapes(m, mbs)  # (the check's own run: `module_chain` keeps it)
    for s, units in enumerate(models.split_of(cfg, num_stages)[:-1]):
        name, shape, dtype = shapes[units.stop - 1]
        if not (dtype.is_floating_point or dtype.is_complex):
            names = described(m)[1]
            raise UserError(
                f"model.kind=module: stage {s + 1} would begin at unit {names[units.stop]}, handed "
                f"{str(dtype).removeprefix('torch.')} (shape {shape}) by unit {name}; a stage receives floating "
                "point, as its input's gradient goes back to the stage before: cut elsewhere "
                "(pipeline.layers_per_stage or model.split_points)"
            )


def shape_defaults(model) -> dict:
    """model.layers: the number of units (the split counts units as layers)."""
    if not model.module:
        return {}
    _, names = described(model)
    return {"layers": len(names)}


def check(cfg) -> None:
    """The module imports and builds, its units cover it and chain (one forward on the meta
    device), its forward calls them in turn and does
    nothing else (`ppx.models.module_forward`), model.layers is their
    count, and model.split_points (if given) become pipeline.layers_per_stage."""
    from torch.nn.parameter import is_lazy

    from ppx.schedules import registry

    m, p = cfg.model, cfg.pipeline
    if not m.module:
        raise UserError("model.kind=module needs model.module (package.module:function)")
    for key in ("batch_fn", "loss_fn"):
        if getattr(m, key):
            load_function(getattr(m, key), f"model.{key}")
    module, names = described(m)
    lazy = next((n for n, q in [*module.named_parameters(), *module.named_buffers()] if is_lazy(q)), None)
    if lazy:
        raise UserError(
            f"model.module={m.module}: its build leaves {lazy} uninitialised (a lazy module: nn.LazyLinear, ...); ppx "
            "splits the model before any forward runs: give its sizes (nn.Linear)"
        )
    if m.layers != len(names):
        again = len(described(dataclasses.replace(m, layers=len(names)))[1])
        if again != len(names):  # (the build reads model.layers: no value of it fits)
            raise UserError(
                f"model.layers={m.layers} but the module has {_units(len(names))}, and {again} with model.layers="
                f"{len(names)}: your build reads model.layers, which ppx sets to the number of units; give the "
                "number of blocks in model.args instead (model.args.depth)"
            )
        raise UserError(
            f"model.layers={m.layers} but the module has {_units(len(names))}: give model.layers={len(names)} "
            "(or no model.layers, in the experiment file too)"
        )
    stages = p.stages * (p.virtual_stages or registry.default_virtual(p.schedule))
    if stages > len(names):
        raise UserError(
            f"{stages} stages but the module has {len(names)} units ({', '.join(names)}): every stage needs at "
            "least one; name smaller units in model.units, or use fewer stages"
        )
    if m.split_points:
        missing = [s for s in m.split_points if s not in names]
        if missing:
            raise UserError(f"model.split_points: {missing[0]!r} is not a unit (units: {', '.join(names)})")
        starts = [names.index(s) for s in m.split_points]
        if len(starts) != stages - 1 or starts != sorted(set(starts)) or starts[0] == 0:
            n = stages - 1
            which = "the unit where stage 1 begins" if n == 1 else f"the {n} units where stages 1-{n} begin"
            if starts[0] == 0:
                wrong = f"{names[0]} is the first unit, where stage 0 begins: leave it out"
            elif len(starts) != n:
                wrong = f"{len(starts)} point{'s' if len(starts) != 1 else ''} for {stages} stages"
            else:
                wrong = "the points are not in forward order" if starts != sorted(starts) else "a point is given twice"
            raise UserError(f"model.split_points: {wrong}; give {which}, in forward order")
        bounds = [0, *starts, len(names)]
        split = [b - a for a, b in zip(bounds, bounds[1:])]
        # (a config checked once holds both, its split points' split: a run's config.yaml, run.paired's entries)
        if p.layers_per_stage is not None and list(p.layers_per_stage) != split:
            raise UserError(
                f"model.split_points split the units {split}, pipeline.layers_per_stage {list(p.layers_per_stage)}: "
                "give one of them"
            )
        p.layers_per_stage = split
    from ppx.models.module_chain import first_batch, moved_buffers, unit_shapes

    first_batch(m, cfg.train.batch_size)  # (the whole batch too, as the ranks ask for it)

    # the units chain on a rank's microbatch (what each stage is handed: `check_split`)
    mbs = cfg.microbatch_size()  # (>= 1: rules.check_parallel ran first)
    unit_shapes(m, mbs, (module, names))
    from ppx.models.module_chain import forward_run
    from ppx.models.module_forward import traced_checks

    checked = traced_checks(module, names)
    if isinstance(checked, str):  # (run once instead: the path one microbatch takes; one that fails is noted)
        checked = forward_run(m, mbs, (module, names))
    wrong, frozen = (None, None) if isinstance(checked, str) else checked
    if frozen:
        raise UserError(
            f"model.module={m.module}: its forward calls unit {frozen} with autograd off (torch.no_grad(), "
            "inference_mode), so no gradient "
            "reaches it or the units before it, where ppx's split runs every unit with autograd on and would train "
            "them: freeze their parameters in your build instead (requires_grad_(False)) and call the unit as any other"
        )
    if wrong:  # (torch's tracer too traces the units' chain, not your forward)
        raise UserError(
            f"model.module={m.module}: its forward {wrong}; ppx's split runs model.units one after the other, "
            "each unit's output the next one's input, so it would train another model than yours: put what "
            "the forward does between units inside one, or give model.units in the order the forward calls them"
        )
    shared_buffers = [(n, k) for n, k in shared_in(module, names, buffers=True) if len(k) > 1]
    if shared_buffers and stages > 1:  # (each stage builds its own model: one copy of the buffer each)
        from ppx.models import split_of

        stage_of = {u: st for st, held in enumerate(split_of(cfg, stages)) for u in held}
        moved = moved_buffers(m, mbs, (module, names))
        for name, units in shared_buffers:
            if name in moved and len({stage_of[u] for u in units}) > 1:
                raise UserError(
                    f"model.module: buffer {name} is shared by units {', '.join(names[u] for u in units)} and moved by "
                    "the forward, on different stages; each stage holds its own copy of it, so stages would move "
                    "theirs apart: give each unit its own buffer, or run those units in one stage "
                    "(pipeline.layers_per_stage)"
                )
    tied = [n for n, k in shared_in(module, names) if len(k) > 1]
    if tied and registry.runs_on_torch(p.schedule, p.executor):
        raise UserError(f"model.module: {tied[0]} is shared by several units; torch's executor does not sum its copies")
    if tied and p.split == "tracer":
        raise UserError(
            f"model.module: {tied[0]} is shared by several units; torch's tracer split gives each stage its own "
            "copy with no sum of their gradients: use pipeline.split=layers"
        )


def shared(model) -> list[tuple[str, list[int]]]:
    """Each parameter's name and the units that hold it (the model built on the meta device)."""
    return shared_in(*described(model))


def shared_in(module, names: list[str], buffers: bool = False) -> list[tuple[str, list[int]]]:
    """Each parameter (``buffers``: buffer, a view with its base) of ``module`` by name, and the
    units (indices into ``names``) that hold it."""
    subs = dict(module.named_modules())
    where: dict[int, tuple[str, list[int]]] = {}
    for k, name in enumerate(names):
        held = subs[name].named_buffers() if buffers else subs[name].named_parameters()
        for pname, param in held:  # (a buffer's view shares it: its base's)
            key = id(param._base) if buffers and param._base is not None else id(param)
            got = where.setdefault(key, (f"{name}.{pname}", []))
            if k not in got[1]:
                got[1].append(k)
    return list(where.values())


def _units(n: int) -> str:
    return f"{n} unit" if n == 1 else f"{n} units"
