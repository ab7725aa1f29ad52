"""A split backward whose W does only the weight-gradient matmuls (``train.split_backward``).

In a stage that *stores*, its routed layers (`ppx.engine.linears`: ``nn.Linear``, GPT-2's
``Conv1D``, convolutions) hand their input and output gradient to the stage's `WeightStore` during I, and I
takes the gradients of every other parameter (norms, embeddings: small weights) itself. The
microbatch's graph is then dropped: between I and W the stage holds only the stores. W
computes each stored layer's weight (and bias) gradient with two matmuls under ``no_grad``,
in the order I stored them, and adds it to the parameter's gradient. This is the zero-bubble
paper's implementation; torch.distributed.pipelining's keeps the graph and the gradients of
its intermediates until W, and ppx's *graph* way (today's, before stores) keeps the graph
and walks it again in W.

The way is chosen once per stage (``auto``) from one forward of a microbatch at build time:
the store holds each routed layer's input and output gradient; the graph holds everything
autograd saved. A retained graph keeps every layer's activations alive, so keeping one layer
"the graph's way" keeps the whole stage's graph: the choice is per stage. A stage stores when
its stores hold no more than its graph (a Llama block: 0.7-0.8 of it), and keeps its graph
otherwise (a stack of Linear + GELU stores as much as its graph). A stage with no routed layer
(the known-cost model, a traced GraphModule) keeps its graph."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from ppx.engine.linears import RoutedLayer
from ppx.errors import UserError


class WeightStore:
    """One stage's stores, microbatch by microbatch; ``layers`` are its routed layers, and
    ``small`` the parameters whose gradients I takes (all the others)."""

    def __init__(self, module: nn.Module, layers: list[RoutedLayer]):
        self.module = module
        shared = _shared_params(module)
        # a weight also used outside its layer (tied) takes its gradient in I, whole
        self.layers = [layer for layer in layers if not any(id(p) in shared for p in layer.params)]
        for layer in self.layers:
            layer.store = self
        self.inputs: dict[int, list] = {}  # mb -> [(layer, input, output's gradient edge), ...] of its forward
        # the list in ``inputs`` of the microbatch whose forward runs (or is re-run) and stores;
        # None: a forward that stores nothing (under train.recompute the first forward, whose I re-runs it)
        self.calls: list | None = None
        self.pending: dict[int, list] = {}  # mb -> [(layer, input, output gradient), ...] in I's order
        # where the small parameters sit, found once: data parallel puts other parameter objects
        # in these slots, never new slots (a weight tied after this would be counted twice)
        self._small_slots = _slots(module, skip={id(layer.module) for layer in self.layers})

    def small_params(self) -> list[torch.Tensor]:
        """Every trainable parameter that no stored layer owns, as the module holds them now
        (read from their slots: data parallel swaps the parameters there between steps)."""
        return [p for slots, name in self._small_slots if (p := slots[name]) is not None and p.requires_grad]

    def stored_params(self) -> list[torch.Tensor]:
        return [p for layer in self.layers for p in layer.params if p.requires_grad]

    # -- F ---------------------------------------------------------------------------------
    def begin(self, mb: int | None) -> None:
        """The forward of ``mb`` starts (None: a forward that stores nothing): each routed
        layer's call appends its input (kept for W) and the edge where its output's gradient
        arrives (I asks autograd for it) to ``calls``."""
        self.calls = None if mb is None else self.inputs.setdefault(mb, [])

    # -- I ---------------------------------------------------------------------------------
    def input_pass(self, mb: int, out: torch.Tensor, x: torch.Tensor, grad_output) -> torch.Tensor | None:
        """I of ``mb``: the input gradient, the small weights' gradients, and each stored
        layer's output gradient, kept with its input for W."""
        small = self.small_params()
        calls = self.inputs.pop(mb, [])
        if calls is self.calls:  # (its forward's list, done with: a later call without `begin` stores nothing)
            self.begin(None)
        wants_x = x.requires_grad
        inputs = ([x] if wants_x else []) + small + [edge for _, _, edge in calls]
        grads = torch.autograd.grad(out, inputs, grad_output, allow_unused=True) if inputs else ()
        k = int(wants_x) + len(small)
        got = [(p, g) for p, g in zip(small, grads[int(wants_x) : k]) if g is not None]
        _accumulate([p for p, _ in got], [g for _, g in got])
        # in the order the backward met them (the last call first), as autograd sums a layer's calls
        self.pending[mb] = [(layer, xi, gy) for (layer, xi, _), gy in zip(calls, grads[k:]) if gy is not None][::-1]
        return grads[0] if wants_x else None

    def held(self, mb: int) -> list[torch.Tensor]:
        """The tensors the store holds for ``mb``: the layers' inputs from its forward on, and
        their output gradients too from its I to its W."""
        if mb in self.pending:
            return [t for _, x, gy in self.pending[mb] for t in (x, gy)]
        return [x for _, x, _ in self.inputs.get(mb, ())]

    # -- W ---------------------------------------------------------------------------------
    def weight_pass(self, mb: int) -> None:
        """W of ``mb``: each stored layer's weight and bias gradients, added to its parameters
        (the stored tensors are detached: nothing here is recorded by autograd). A layer called
        several times has its contributions summed first, in the order the backward met them
        and in the compute dtype, then added, as autograd's input buffer and the cast's
        backward do. Each layer's gradients are added as soon as its last call is summed, so
        W holds one layer's new gradients at a time, not the stage's (as autograd's
        AccumulateGrad does); per layer, no more Python than it takes (on llama-tiny's stage the
        matmuls are 0.7 of W, the rest its Python and additions)."""
        pending = self.pending.pop(mb)
        last = {layer: k for k, (layer, _, _) in enumerate(pending)}
        sums: dict = {}  # layer -> [weight gradient, bias gradient or None], for layers called again
        for k, (layer, x, gy) in enumerate(pending):
            gw, gb = layer.kind.grads(gy, x, layer.has_bias, layer.stored_weight)
            got = sums.pop(layer, None)
            if got is not None:
                gw = got[0] + gw
                gb = None if gb is None else got[1] + gb
            if last[layer] != k:
                sums[layer] = [gw, gb]
                continue
            own = layer.own  # the parameters as the module holds them now (FSDP swaps them there)
            _add_grad(own["weight"], gw)
            if gb is not None:
                _add_grad(own["bias"], gb)

    def microbatches(self) -> set[int]:
        """Microbatches the store holds anything of."""
        return set(self.pending) | set(self.inputs)


def _add_grad(p: torch.Tensor, g: torch.Tensor) -> None:
    """p.grad += g (a first gradient is g itself), g cast to the parameter's dtype first."""
    g = _to_add(p, g)
    if g is not None:
        p.grad.add_(g)


def _accumulate(params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """`_add_grad` for each pair, the additions in one foreach call."""
    into, adds = [], []
    for p, g in zip(params, grads):
        g = _to_add(p, g)
        if g is not None:
            into.append(p.grad)
            adds.append(g)
    if into:
        torch._foreach_add_(into, adds)


def _to_add(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor | None:
    """``g`` in ``p``'s dtype, to add to ``p.grad``; None when there is nothing to add (``p``
    takes no gradient, or ``g`` became its first one)."""
    if not p.requires_grad:
        return None
    if g.dtype != p.dtype:
        g = g.to(p.dtype)
    if p.grad is None:
        p.grad = g
        return None
    return g


def _slots(module: nn.Module, skip: set[int]) -> list[tuple[dict, str]]:
    """(a module's parameter slots, name) of each parameter of ``module`` outside the modules
    whose ids are in ``skip``, once each and in ``module.parameters()``'s order: reading them
    costs a dict lookup a parameter, where ``parameters()`` walks the module tree."""
    seen: set[int] = set()
    out = []
    for sub in module.modules():
        if id(sub) in skip:
            continue
        for name, p in sub._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append((sub._parameters, name))
    return out


def _shared_params(module: nn.Module) -> set[int]:
    """ids of parameters registered in more than one place of ``module``."""
    seen: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {k for k, n in seen.items() if n > 1}


def choose(
    mode: str, module: nn.Module, layers: list[RoutedLayer], trial: Callable[[], tuple], exclude: set[int]
) -> tuple[WeightStore | None, dict]:
    """The way of one split stage (``mode``: ``train.split_backward``): its `WeightStore`, or
    None for the graph's way, and what summary.json says of it. ``trial()`` runs one forward
    of a microbatch through the stage (with a graph) and returns (input, output, output
    gradient); auto runs it once and I after it, to weigh the stores against the graph. A
    stage without Linear layers keeps its graph under store too (a model whose stages have
    none at all, the known-cost model or the tracer's, is refused store by the config's rules)."""
    if mode == "graph":
        return None, {"mode": "graph", "why": "train.split_backward=graph"}
    if not layers:  # (an embedding alone: store stores the stages that have them, as auto does)
        return None, {"mode": "graph", "why": "no Linear layers to store"}
    store = WeightStore(module, layers)
    info = {"mode": "store", "stored_layers": len(store.layers), "small_params": len(store.small_params())}
    try:
        graph_bytes, store_bytes = measure(store, trial, exclude)
    except RuntimeError as e:  # a layer that cannot store (its input needs no gradient)
        if mode == "store":
            raise UserError(f"train.split_backward=store: {e}; use train.split_backward=auto") from e
        return _unstore(layers, {"mode": "graph", "why": str(e)})
    info.update(graph_bytes=graph_bytes, store_bytes=store_bytes)
    if mode == "store":
        return store, {**info, "why": "train.split_backward=store"}
    if store_bytes <= graph_bytes:
        return store, {**info, "why": "the stores hold no more than the graph"}
    return _unstore(layers, {**info, "mode": "graph", "why": "the stores would hold more than the graph"})


def _unstore(layers: list[RoutedLayer], info: dict) -> tuple[None, dict]:
    for layer in layers:
        layer.store = None
        layer.forget_weight()  # (nor the trial's weight kept)
    return None, info


def measure(store: WeightStore, trial: Callable[[], tuple], exclude: set[int]) -> tuple[int, int]:
    """(bytes the graph's way holds of one microbatch from its I to its W: what its forward
    saved, and the output gradient its W takes again; bytes its stores hold from I to W), by
    storage, leaving out parameters and ``exclude`` (the weight copies' storages, a live set:
    the trial's forward may cast them): one forward the graph's way, then one forward and I
    that store, under a forked RNG, every gradient they leave reset."""
    module = store.module
    params = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())}
    saved: dict[int, int] = {}
    kept: list[torch.Tensor] = []  # alive until the trial ends: no address counted twice

    def pack(t: torch.Tensor) -> int:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in exclude:  # (read now: the trial's forward casts the copies)
            saved[ptr] = t.untyped_storage().nbytes()
        kept.append(t)
        # not the tensor: a node saving its own output would then hold itself, a cycle through
        # autograd's C++ graph that Python's collector never frees, and this graph never runs
        # the backward that would release it (it kept a whole forward alive for the run)
        return len(kept) - 1

    def unpack(i: int) -> torch.Tensor:  # a forward that differentiates inside itself; never after the trial
        return kept[i]

    with torch.random.fork_rng(), torch.enable_grad():
        for layer in store.layers:
            layer.store = None
        try:
            with saved_tensors_hooks(pack, unpack):
                _, _, grad_output = trial()
            if grad_output is not None:  # (none on the last stage: its I starts from the loss)
                saved[grad_output.untyped_storage().data_ptr()] = grad_output.untyped_storage().nbytes()
        finally:
            kept.clear()
            for layer in store.layers:
                layer.store = store
        store.begin(-1)
        x, out, grad_output = trial()
        outside = _used_outside(out, store.layers)
        if outside:
            store.pending.pop(-1, None)
            raise RuntimeError(
                f"layer {outside}: its weight is also used outside its own call (tied, or F.linear on it), "
                "so W alone would miss that use's gradient"
            )
        store.input_pass(-1, out, x, grad_output)
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in store.held(-1)}
    store.pending.pop(-1)
    for p in module.parameters():
        p.grad = None
    return sum(saved.values()), sum(held.values())


def _used_outside(out: torch.Tensor, layers: list[RoutedLayer]) -> str | None:
    """The name of a stored layer whose weight or bias ``out``'s graph reaches, or None: a
    storing layer's own call puts them in detached, so one reached is used elsewhere too (a
    weight tied by a function call, ``F.linear(x, self.fc.weight.t())``, a layer whose weight
    is only ever read), whose gradient W alone would drop."""
    owner = {id(p): layer.name for layer in layers for p in layer.params}
    seen: set = set()
    stack = [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        name = owner.get(id(getattr(fn, "variable", None)))
        if name is not None:
            return name
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return None
