"""A stage's large-weight layers run through ppx: ``nn.Linear``, Hugging Face's GPT-2
``Conv1D`` (a Linear with its weight stored transposed, found by its class name and shape,
without importing transformers), and ``nn.Conv1d``/``Conv2d``/``Conv3d`` (zero padding given
as numbers).

Two things hang on that routing:

- **One compute-dtype copy of the weights per step** (`StepWeights`): under bf16/fp16
  autocast, autocast casts every weight again in every microbatch's forward, and each
  microbatch's graph keeps its own copy. ppx casts each routed layer's weight (and bias) once
  per step instead, with the cast in the graph (gradients reach the fp32 master weights as
  autocast's would), and every microbatch uses that copy, as FSDP2's mixed precision and
  Megatron's bf16 parameters do. The copies are the weights in another dtype, not
  activations: their storages are listed (`StepWeights.storages`) so the memory counters
  leave them out of a microbatch's saved bytes.
- **A split backward's weight gradients without re-walking the graph**
  (`ppx.engine.weight_store`): in a stage that stores, a routed layer's weights enter its
  forward detached, so autograd's own backward computes only its input gradient; the store
  keeps the layer's input and its output's gradient edge, I asks autograd for the gradient
  there too (as torch.distributed.pipelining's I asks for its intermediates'), and the W pass
  computes the weight and bias gradients from the pair.

W's formulas are autograd's own for these ops (`torch.mm` in the same operand order and
layout as `MmBackward`/`AddmmBackward`; a convolution's ``convolution_backward`` asked for its
weight and bias alone), so the gradients are bitwise those of a plain backward
(tests/unit/test_weight_store.py checks every layout)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.nn import functional as F


class LinearKind:
    """y = x W^T + b (``nn.Linear``: weight (out, in))."""

    forward = staticmethod(F.linear)  # (x, w, b)

    @staticmethod
    def stored(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """The forward with ``w`` (and ``b``) detached, computed as with weights that need a
        gradient: ``matmul`` folds an input of more than two dimensions that is not contiguous
        to 2-D (a copy) only when its weight needs a gradient, and multiplies it batched
        otherwise, which may round differently; here it is folded the same way (and a bias added
        after the product, as ``linear`` adds it to a product it did not fuse)."""
        if x.dim() > 2 and not x.is_contiguous():
            y = x.reshape(-1, x.shape[-1]).mm(w.t())
            return (y if b is None else y + b).view(*x.shape[:-1], w.shape[0])
        return F.linear(x, w, b)

    @staticmethod
    def weight_grad(gy2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return gy2.t().mm(x2)

    @classmethod
    def grads(cls, gy: torch.Tensor, x: torch.Tensor, bias: bool, weight=None) -> tuple:
        """(weight gradient, bias gradient or None) from the layer's output gradient and input
        (``weight``: the one its forward took, for a kind that reads its layout)."""
        if gy.dim() != 2:
            gy, x = gy.reshape(-1, gy.shape[-1]), x.reshape(-1, x.shape[-1])
        return cls.weight_grad(gy, x), gy.sum(0) if bias else None


class Conv1DKind:
    """y = x W + b (GPT-2's ``Conv1D``: weight (in, out), computed with addmm)."""

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.addmm(b, x2, w) if b is not None else x2.mm(w)
        return y.view(*x.shape[:-1], w.shape[1])

    stored = forward  # (it multiplies in 2-D whether or not its weight needs a gradient)

    @staticmethod
    def weight_grad(gy2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return x2.t().mm(gy2)

    grads = classmethod(LinearKind.grads.__func__)


class ConvKind:
    """A convolution (``nn.Conv1d``/``2d``/``3d``, zero padding given as numbers): its own
    ``_conv_forward``, and W's gradients from ``convolution_backward`` asked for the weight and
    bias only, as autograd's backward computes them apart from the input's."""

    def __init__(self, module: nn.Module):
        self.forward = self.stored = module._conv_forward  # (x, w, b)
        self.weight_shape = tuple(module.weight.shape)  # (the whole weight's: data parallel may shard it later)
        self.args = (list(module.stride), list(module.padding), list(module.dilation), False, [0] * len(module.stride))
        self.groups = module.groups

    def grads(self, gy: torch.Tensor, x: torch.Tensor, bias: bool, weight=None) -> tuple:
        # the weight's shape, dtype and memory format are read (mkldnn and cuDNN pick their
        # layout from it and the input's), not its values: the forward's weight's, empty
        w = torch.empty_like(weight) if weight is not None else x.new_empty(self.weight_shape)
        if x.dim() == w.dim() - 1:  # an unbatched input ((C, H, W)): convolution_backward wants a batch
            x, gy = x.unsqueeze(0), gy.unsqueeze(0)
        sizes = [self.weight_shape[0]] if bias else None
        _, gw, gb = torch.ops.aten.convolution_backward(gy, x, w, sizes, *self.args, self.groups, [False, True, bias])
        return gw, gb


def kind_of(module: nn.Module) -> object | None:
    """The routed kind of ``module``, or None for a layer ppx leaves to autograd (one whose
    weight is not a parameter of its own, a convolution padded otherwise than with zeros given
    as numbers)."""
    if not isinstance(module._parameters.get("weight"), torch.Tensor):
        return None
    if type(module) is nn.Linear:
        return LinearKind
    if type(module) in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
        numbers = not isinstance(module.padding, str)
        return ConvKind(module) if module.padding_mode == "zeros" and numbers else None
    w = module._parameters["weight"]
    if type(module).__name__ == "Conv1D" and w.dim() == 2:
        if getattr(module, "nf", None) == w.shape[1]:  # transformers' Conv1D: weight (nx, nf)
            return Conv1DKind
    return None


class RoutedLayer:
    """One routed layer: its module, kind, parameters, the step's weights and, in a storing
    stage, the store that keeps its input and output gradient for W."""

    def __init__(self, name: str, module: nn.Module, kind, weights: StepWeights):
        self.name, self.module, self.kind, self.weights = name, module, kind, weights
        self.store = None  # a `ppx.engine.weight_store.WeightStore` when this layer's W is deferred
        self.has_bias = getattr(module, "bias", None) is not None
        self.own = module._parameters  # the module's own parameter slots (read by name: no __getattr__)
        self.op, self.stored_op = kind.forward, kind.stored
        # its inputs' device type ("cpu", "cuda"), from its first call: layers are routed after
        # the stage's module is on its device (ppx.engine.split_setup), and never move after
        self.device_type: str | None = None
        self._weight = self._detached = None  # the weight last stored with, and it detached
        module.forward = self.forward  # the instance's forward: every call goes through ppx

    def unroute(self) -> None:
        """Back to the module's own forward (nothing of ppx's left on it)."""
        if self.module.__dict__.get("forward") == self.forward:
            del self.module.forward
        self.store = self.device_type = None
        self.forget_weight()
        if self in self.weights.layers:
            self.weights.layers.remove(self)

    @property
    def stored_weight(self) -> torch.Tensor | None:
        """The weight (detached) its storing forward took last: the step's."""
        return self._detached

    def forget_weight(self) -> None:
        """Drop the weight last stored with, and its detached view (the next storing call takes
        the weight the layer has then)."""
        self._weight = self._detached = None

    @property
    def params(self) -> list[torch.Tensor]:
        """The layer's weight and bias (as the module holds them now: FSDP may swap them)."""
        b = self.module.bias
        return [self.module.weight] + ([b] if b is not None else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # every microbatch's forward calls this once per layer (29 times a stage of llama-tiny):
        # no more Python than it takes, on a small model it is a tenth of the forward
        w, b = self.weights.of(self)
        if self.weights.mixed:  # (in fp32 ppx runs no autocast)
            device = self.device_type  # x.device costs more than the rest of this forward's Python
            if device is None:
                device = self.device_type = x.device.type
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
                if x.dtype != dtype and x.is_floating_point():
                    x = self.weights.cast(x, dtype)  # autocast's cast, in the graph the same way
            elif self.weights.dtype is not None:  # a region your model runs with autocast off: its own weights
                own = self.own
                w, b = own["weight"], own.get("bias")
        store = self.store
        calls = None if store is None else store.calls
        if calls is None or not torch.is_grad_enabled():
            return self.op(x, w, b)  # (no microbatch: a forward whose graph is never differentiated)
        # storing: autograd differentiates the input only (the weights enter detached); the
        # store keeps the input and where the output's gradient will arrive, for I to collect
        if not x.requires_grad:
            raise RuntimeError(
                f"layer {self.name}: its input needs no gradient, so its weight gradient cannot be stored"
            )
        if w is not self._weight:  # (detached once per weight: the step's copy, or the parameter FSDP put there)
            self._weight, self._detached = w, w.detach()
        y = self.stored_op(x, self._detached, None if b is None else b.detach())
        calls.append((self, x.detach(), _edge(y)))
        return y


def _edge(y: torch.Tensor) -> GradientEdge:
    """Where ``y``'s gradient arrives: `get_gradient_edge`'s edge, built directly for a node of
    autograd's own (what these layers' ops make; a custom Function's node needs the ownership
    token that `get_gradient_edge` adds), a third of its cost."""
    fn = y.grad_fn
    if fn is None or isinstance(fn, torch._C._FunctionBase):
        return get_gradient_edge(y)
    return GradientEdge(fn, y.output_nr)


class StepWeights:
    """The weights a stage's routed layers compute with. In fp32 their own parameters; in a
    mixed ``dtype``, one copy in that dtype per step (`refresh`, before the step's first
    forward), cast with grad so the gradients reach the fp32 parameters."""

    def __init__(self, dtype: torch.dtype | None):
        self.dtype = dtype  # None: the parameters themselves
        # the stage runs under autocast: a mixed dtype, whether these copies make it or (data
        # parallel, which sets ``dtype`` to None) FSDP2's mixed-precision policy does
        self.mixed = dtype is not None
        self.copies: dict[int, tuple] = {}
        self.storages: set[int] = set()  # data pointers of the copies (not activation memory)
        self.layers: list[RoutedLayer] = []
        self._last_cast: tuple | None = None  # (a weak reference to the input, its version, grad mode, its cast)
        self._sharing = False  # inside a stage's forward (`sharing_casts`)

    def cast(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``x`` in ``dtype``; inside `sharing_casts`, one copy for every layer that takes the
        same ``x`` in a row (Llama's q, k and v projections take one norm's output, its gate and
        up projections another), where autocast casts it again for each layer and each layer's
        graph keeps its own copy. The layers' input gradients then meet in ``dtype`` at the
        copy, before its cast back, as they do where the model hands the layers a tensor in
        ``dtype`` already (ppx's own models)."""
        if not self._sharing:  # (a forward of the model's own, a checkpoint's recomputation in a backward)
            return x.to(dtype)
        last, grad = self._last_cast, torch.is_grad_enabled()
        if last is not None and last[0]() is x and last[1] == x._version and last[2] == grad:
            if last[3].dtype == dtype:
                return last[3]
        y = x.to(dtype)
        self._last_cast = (weakref.ref(x), x._version, grad, y)  # (x itself is not kept for it)
        return y

    @contextlib.contextmanager
    def sharing_casts(self):
        """`cast` shares its copies within this block (a stage's forward); nothing kept after it."""
        self._sharing = True
        try:
            yield
        finally:
            self._sharing, self._last_cast = False, None

    def of(self, layer: RoutedLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.dtype is None:  # the parameters as the module holds them now (FSDP swaps them there)
            own = layer.own
            return own["weight"], own.get("bias")
        copy = self.copies.get(id(layer))
        if copy is None:  # outside a step (a reference forward): cast now
            copy = self.copies[id(layer)] = self._cast(layer)
        return copy

    def refresh(self) -> None:
        """New copies from the current weights (call before each step's first forward)."""
        self.copies.clear()
        self.storages.clear()
        for layer in self.layers:  # no weight of before kept alive (a copy, or a parameter data parallel replaced)
            layer.forget_weight()
        if self.dtype is None:
            return
        for layer in self.layers:
            self.copies[id(layer)] = self._cast(layer)

    def _cast(self, layer: RoutedLayer) -> tuple:
        with torch.enable_grad():  # in the graph even when the forward runs without one (recompute)
            w = layer.module.weight.to(self.dtype)
            b = layer.module.bias.to(self.dtype) if layer.module.bias is not None else None
        for t in (w, b):
            if t is not None:
                self.storages.add(t.untyped_storage().data_ptr())
        return w, b


def route_layers(
    module: nn.Module, weights: StepWeights, keep: Callable[[str, nn.Module], bool] = lambda n, m: True
) -> list[RoutedLayer]:
    """Route every Linear-like layer and convolution of ``module`` (that ``keep`` accepts) through ppx."""
    layers = []
    for name, sub in module.named_modules():
        kind = kind_of(sub)
        if kind is not None and keep(name, sub):
            layers.append(RoutedLayer(name, sub, kind, weights))
    weights.layers.extend(layers)
    return layers
