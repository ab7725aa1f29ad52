"""A split backward whose W does only the weight-gradient matmuls (``train.split_backward``).

In a stage that *stores*, its routed layers (`ppx.engine.linears`: ``nn.Linear``, GPT-2's
``Conv1D``) hand their input and output gradient to the stage's `WeightStore` during I, and I
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
its stores hold no more than its graph (a Llama block: about 0.8 of it), and keeps its graph
otherwise (a stack of Linear + GELU stores as much as its graph). A stage with no routed layer
(the known-cost model, a traced GraphModule) keeps its graph."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from ppx.engine.linears import RoutedLayer
from ppx.errors import UserError

MODES = ("auto", "store", "graph")


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
        self._mb: int | None = None  # the microbatch whose I runs
        self.pending: dict[int, list] = {}  # mb -> [(layer, input, output gradient), ...] in I's order

    def small_params(self) -> list[torch.Tensor]:
        """Every trainable parameter that no stored layer owns (as the module holds them now)."""
        stored = {id(p) for layer in self.layers for p in layer.params}
        return [p for p in self.module.parameters() if p.requires_grad and id(p) not in stored]

    def stored_params(self) -> list[torch.Tensor]:
        return [p for layer in self.layers for p in layer.params if p.requires_grad]

    # -- I ---------------------------------------------------------------------------------
    @property
    def storing(self) -> bool:
        """True inside an I pass (a B of this stage takes every gradient at once)."""
        return self._mb is not None

    def put(self, layer: RoutedLayer, x: torch.Tensor, gy: torch.Tensor) -> None:
        if self._mb is None:
            raise RuntimeError(f"layer {layer.name} stored its gradient outside an I pass")
        self.pending[self._mb].append((layer, x, gy))

    def input_pass(self, mb: int, out: torch.Tensor, x: torch.Tensor, grad_output) -> torch.Tensor | None:
        """I of ``mb``: the input gradient and the small weights' gradients, stores for W."""
        self._mb = mb
        self.pending[mb] = []
        small = self.small_params()
        wants_x = x.requires_grad
        inputs = ([x] if wants_x else []) + small
        if not inputs:  # nothing to differentiate but the stored layers: walk to their weights
            inputs = self.stored_params()
        try:
            grads = torch.autograd.grad(out, inputs, grad_output, allow_unused=True)
        finally:
            self._mb = None
        for p, g in zip(small, grads[int(wants_x) :]):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        return grads[0] if wants_x else None

    def held(self, mb: int) -> list[torch.Tensor]:
        """The tensors ``mb`` holds between its I and its W."""
        return [t for _, x, gy in self.pending.get(mb, ()) for t in (x, gy)]

    # -- W ---------------------------------------------------------------------------------
    @torch.no_grad()
    def weight_pass(self, mb: int) -> None:
        """W of ``mb``: each stored layer's weight and bias gradients, added to its parameters
        (a layer called several times: its contributions summed in I's order first, in the
        compute dtype, then cast, as autograd's input buffer and the cast's backward do)."""
        sums: dict[int, list] = {}
        for layer, x, gy in self.pending.pop(mb):
            gy2 = gy.reshape(-1, gy.shape[-1])
            parts = [layer.kind.weight_grad(gy2, x.reshape(-1, x.shape[-1]))]
            if layer.module.bias is not None:
                parts.append(gy2.sum(0))
            got = sums.setdefault(id(layer), [layer, None])
            got[1] = parts if got[1] is None else [a + b for a, b in zip(got[1], parts)]
        for layer, parts in sums.values():
            for p, g in zip(layer.params, parts):
                if p.requires_grad:
                    g = g.to(p.dtype)
                    p.grad = g if p.grad is None else p.grad + g

    def in_flight(self) -> int:
        return len(self.pending)


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
    gradient); auto runs it once and I after it, to weigh the stores against the graph."""
    if mode == "graph":
        return None, {"mode": "graph", "why": "train.split_backward=graph"}
    if not layers:
        if mode == "store":
            raise UserError(
                "train.split_backward=store: a stage has no Linear layer to store; use train.split_backward=auto"
            )
        return None, {"mode": "graph", "why": "no Linear layers to store"}
    store = WeightStore(module, layers)
    info = {"mode": "store", "stored_layers": len(store.layers), "small_params": len(store.small_params())}
    if mode == "store":
        return store, {**info, "why": "train.split_backward=store"}
    graph_bytes, store_bytes = measure(store, trial, exclude)
    info.update(graph_bytes=graph_bytes, store_bytes=store_bytes)
    if store_bytes <= graph_bytes:
        return store, {**info, "why": "the stores hold no more than the graph"}
    for layer in layers:
        layer.store = None
    return None, {**info, "mode": "graph", "why": "the stores would hold more than the graph"}


def measure(store: WeightStore, trial: Callable[[], tuple], exclude: set[int]) -> tuple[int, int]:
    """(bytes one microbatch's forward saves, bytes its stores hold from I to W), by storage,
    leaving out parameters and ``exclude`` (weight copies); one forward and one I, run under
    a forked RNG, with every gradient they leave reset."""
    module = store.module
    params = {p.untyped_storage().data_ptr() for p in module.parameters()} | exclude
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.random.fork_rng(), torch.enable_grad():
        with saved_tensors_hooks(pack, lambda t: t):
            x, out, grad_output = trial()
        store.input_pass(-1, out, x, grad_output)
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in store.held(-1)}
    store.pending.pop(-1)
    for p in module.parameters():
        p.grad = None
    return sum(saved.values()), sum(held.values())
