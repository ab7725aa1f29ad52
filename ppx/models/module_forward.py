"""Whether your model's forward calls its units in turn and does nothing else
(``model.kind=module``): ppx's layer split runs the units one after the other, each unit's
output the next one's input, so a forward that does more (a skip connection across units, a
scale, a cast, another order, a unit called twice) would train another model than yours.

Read from the forward's graph, traced with the units as leaves (`torch.fx`, on the model built
on the meta device: no memory, no compute). Work whose result reaches neither a unit nor the
output (a print of a shape) is left alone. The graph does not show a unit called under
``torch.no_grad()``: the tracer notes the grad mode at each unit's call (`traced_checks`). A
forward torch.fx cannot trace (Python control flow on values, ...; `untraced` says why) is run
once instead, with hooks on its units (`run_once`): the path that input takes is checked."""

from __future__ import annotations

import contextlib
import functools
import inspect
import io

import torch
from torch import fx, nn


class _UnitsAsLeaves(fx.Tracer):
    """The units are leaves; a module holding units is traced into, torch's own too (an
    nn.TransformerEncoder whose layers are the units)."""

    def __init__(self, units: set[str]):
        super().__init__()
        self.units = units
        self.holders = {u.rsplit(".", k)[0] for u in units for k in range(1, u.count(".") + 1)}
        self.without_grad: list[str] = []  # the units called with autograd off (torch.no_grad())

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.units:
            return True
        return qualname not in self.holders and super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward, args, kwargs):
        name = self.path_of_module(m)
        if name in self.units and not torch.is_grad_enabled():
            self.without_grad.append(name)
        return super().call_module(m, forward, args, kwargs)


def _defaults(module: nn.Module) -> dict:
    """The forward's arguments after its first that have defaults, at their defaults: ppx hands
    the first unit one tensor, so an optional mask stays None (torch.fx would trace it as given)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def trace(module: nn.Module, names: list[str]) -> tuple[fx.Graph, list[str]] | str:
    """The forward's graph with the units as leaves and the units it calls with autograd off,
    or why torch.fx cannot trace it (what the forward prints while traced is not shown)."""
    tracer = _UnitsAsLeaves(set(names))
    try:
        with contextlib.redirect_stdout(io.StringIO()), torch.enable_grad():
            return tracer.trace(module, concrete_args=_defaults(module) or None), tracer.without_grad
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first[:160]}" if first else type(e).__name__


def untraced(module: nn.Module, names: list[str]) -> str | None:
    """Why the forward cannot be checked (torch.fx fails on it), or None."""
    got = trace(module, names)
    return got if isinstance(got, str) else None


def traced_checks(module: nn.Module, names: list[str]) -> tuple[str | None, str | None] | str:
    """(What the forward does besides calling ``names`` in turn and returning the last one's
    output, alone or first of a tuple or list, in words; the first unit it calls under
    ``torch.no_grad()`` whose parameters, or those of a unit before it, train: no gradient
    reaches them through it, where ppx's chain of units would train them), each None where
    there is none, from one trace of the forward; or why torch.fx cannot trace it."""
    traced = trace(module, names)
    if isinstance(traced, str):
        return traced
    return _problem(traced[0], names), _first_training(module, names, traced[1])


def _problem(graph: fx.Graph, names: list[str]) -> str | None:
    nodes = list(graph.nodes)
    calls = [n for n in nodes if n.op == "call_module" and n.target in names]
    order = [n.target for n in calls]
    if order != names:
        return _order_problem(order, names)
    live = _feeding(calls[-1])
    # what feeds the last unit, and in-place work on anything of the chain (``h.mul_(2)``)
    chain = live | set(calls)
    extra = [
        n
        for n in nodes
        if n.op not in ("placeholder", "output")
        and n not in calls
        and (n in live or _in_place(n) and any(a in chain for a in n.all_input_nodes))
    ]
    if extra:
        at = nodes.index(extra[0])
        later = [c.target for c in calls if nodes.index(c) > at]
        where = f"before unit {later[0]}" if later else f"after unit {calls[-1].target}"
        return f"does more than call its units in turn: {_op(extra[0])} {where}"
    inputs = [n for n in nodes if n.op == "placeholder"]
    for k, call in enumerate(calls):
        before = calls[k - 1] if k else inputs[0] if inputs else None
        if list(call.args) != [before] or call.kwargs:
            what = f"unit {calls[k - 1].target}'s output" if k else "the forward's input"
            return f"hands unit {call.target} {_said(call.args, call.kwargs)}, not {what} alone"
    result = next(n for n in nodes if n.op == "output").args[0]
    first = result[0] if isinstance(result, (tuple, list)) and result else result
    if first is not calls[-1]:
        what = _op(result) if isinstance(result, fx.Node) else _said([result], {})
        return f"returns {what}, not the last unit's output"
    return None


def _first_training(module: nn.Module, names: list[str], off: list[str]) -> str | None:
    """The first of ``off`` (units called with autograd off) that trains, or a unit before it."""
    for name in off:
        k = names.index(name)
        if any(p.requires_grad for u in names[: k + 1] for p in module.get_submodule(u).parameters()):
            return name
    return None


def run_once(module: nn.Module, names: list[str], x: torch.Tensor) -> tuple[str | None, str | None]:
    """(What the forward does besides calling ``names`` in turn and returning the last one's
    output; the unit it calls with autograd off that trains: as `traced_checks` says them),
    each None where there is none, from one run of the forward on ``x`` with
    hooks on its units: each call's order, grad mode and input (the tensor the unit before
    returned, not changed in place since), and the forward's output. For a forward torch.fx
    cannot trace; its other inputs' paths are not seen. Its exceptions are the caller's."""
    calls: list[tuple[str, bool, bool]] = []  # (unit, autograd on, handed the chain's tensor as it was)
    last = {"t": x, "version": x._version}

    def before(m, args, kwargs, name):
        handed = len(args) == 1 and not kwargs and args[0] is last["t"]
        handed = handed and getattr(args[0], "_version", None) == last["version"]
        calls.append((name, torch.is_grad_enabled(), handed))

    def after(m, args, kwargs, out, name):
        last["t"], last["version"] = out, getattr(out, "_version", None)

    subs = dict(module.named_modules())
    # (before any hook of the unit's own, which may hand it something else, as it does in the run too)
    hooks = [
        subs[n].register_forward_pre_hook(functools.partial(before, name=n), with_kwargs=True, prepend=True)
        for n in names
    ]
    hooks += [subs[n].register_forward_hook(functools.partial(after, name=n), with_kwargs=True) for n in names]
    try:
        with contextlib.redirect_stdout(io.StringIO()), torch.enable_grad():
            out = module(x)
    finally:
        for h in hooks:
            h.remove()
    order = [name for name, _, _ in calls]
    frozen = _first_training(module, names, [name for name, on, _ in calls if not on])
    if order != names:
        return _order_problem(order, names), frozen
    for k, (name, _, handed) in enumerate(calls):
        if not handed:
            source = f"unit {names[k - 1]}'s output" if k else "the forward's input"
            return (
                f"hands unit {name} something other than {source} alone (another tensor, or changed in place)",
                frozen,
            )
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if first is not last["t"] or getattr(first, "_version", None) != last["version"]:
        return "returns another tensor than the last unit's output (or changes it in place)", frozen
    return None, frozen


def _order_problem(order: list[str], names: list[str]) -> str:
    """The forward's unit calls, ``order``, against ``names``, in words."""
    twice = next((t for t in order if order.count(t) > 1), None)
    if twice is not None:
        return f"calls unit {twice} {order.count(twice)} times, where the split runs each unit once"
    missing = [t for t in names if t not in order]
    if missing:
        return f"never calls unit {missing[0]}, which the split runs"
    return f"calls its units in the order {', '.join(order)}, where model.units gives {', '.join(names)}"


def _in_place(node: fx.Node) -> bool:
    """A call that changes its input: ``mul_``, ``relu_``, ``inplace=True``."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return node.op in ("call_method", "call_function") and (
        (name.endswith("_") and not name.startswith("_")) or node.kwargs.get("inplace") is True
    )


def _feeding(output: fx.Node) -> set:
    """The nodes whose results reach ``output``."""
    seen, todo = set(), [output]
    while todo:
        node = todo.pop()
        for up in node.all_input_nodes:
            if up not in seen:
                seen.add(up)
                todo.append(up)
    return seen


def _op(node: fx.Node) -> str:
    """A node in words: ``add(blocks_3, embed)``, ``float(head)``, ``act (not a unit)``."""
    if node.op == "call_module":
        return f"{node.target} (not a unit)"
    if node.op == "get_attr":
        return f"its attribute {node.target}"
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return f"{name}({_said(node.args, node.kwargs)})"


def _said(args, kwargs) -> str:
    parts = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items()]
    return ", ".join(parts) or "nothing"
