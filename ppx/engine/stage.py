"""One pipeline stage on its rank: runs forward and backward per microbatch and keeps what
backward needs between the two."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from ppx.engine.buffers import untouched


class StageRunner:
    """Forward/backward of stage ``index`` for one microbatch at a time.

    The first stage reads data, the others a received activation (made a leaf that requires
    grad, so backward yields the gradient to send back). The last stage computes the loss,
    scaled by ``loss_scale`` (1/microbatches) so the summed microbatch gradients equal the
    full-batch gradient. ``precision`` (`ppx.engine.precision.Precision`, None: fp32) runs the
    forward under autocast, sends the activation in the compute dtype and, for fp16, multiplies
    the loss by the loss scale (the loss returned for the report is unscaled). ``recompute``
    (`ppx.engine.recompute.Recompute`, None: keep what autograd saves) keeps only what its mode
    keeps and re-runs the forward, once, at the start of the microbatch's B or I. ``store``
    (`ppx.engine.weight_store.WeightStore`, None: the graph's way) makes a split backward's I
    store what W needs and drop the graph, and W do only the weight matmuls. ``weights``
    (`ppx.engine.linears.StepWeights`, None: nothing routed) are the stage's compute-dtype
    weight copies, made anew in the first forward of each step (`new_step`).
    """

    def __init__(
        self,
        index: int,
        module: nn.Module,
        first: bool,
        last: bool,
        loss_fn: Callable,
        loss_scale: float,
        training: bool,
        split: bool = False,
        precision=None,
        recompute=None,
        store=None,
        weights=None,
    ):
        self.index, self.module = index, module
        self.first, self.last = first, last
        self.loss_fn, self.loss_scale, self.training = loss_fn, loss_scale, training
        self.split = split  # the schedule splits this stage's backward into I and W
        # every I of this stage is followed at once by its W (`whole_backward_stages`): the I
        # runs the whole backward, the W nothing (set by the rank's build under split_backward=auto or drain)
        self.whole_in_input = False
        # microbatches the schedule gives a whole B on this split stage (a list that splits only
        # where a W fills an idle): their forward stores nothing, their B is one plain backward
        self.whole_mbs: frozenset[int] = frozenset()
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}  # None: to recompute
        self.grad_outputs: dict[int, torch.Tensor | None] = {}
        self.precision = precision
        self.recompute = recompute
        self.store = store
        self.weights, self._stale = weights, True
        # after each W: where the W's gradients go once added (data parallel in a mixed dtype:
        # FSDP2's fp32 accumulator, `DataParallel.accumulate`); None: they stay in .grad
        self.after_weight_pass: Callable[[], None] | None = None
        # whether the stage's module changes its input in place (an in-place ReLU first): then it
        # is handed a copy, as the stage input must stay a leaf autograd lets be, and what a
        # recomputed forward re-runs from (None: not known until the first forward, handed one)
        self.copies_input: bool | None = None

    def _call(self, x):
        """The stage's module on ``x``, or on a copy of it (`copies_input`)."""
        if self.copies_input is False or not isinstance(x, torch.Tensor):
            return self.module(x)
        handed = x.clone()
        out = self.module(handed)
        if self.copies_input is None:
            self.copies_input = handed._version > 0
        return out

    def _run(self, x: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """The stage's forward (the loss on the last stage), under the precision's autocast."""
        prec = self.precision
        if prec is None:
            out = self._call(x)
            return self.loss_fn(out, target) * self.loss_scale if self.last else out
        shared = self.weights.sharing_casts() if self.weights is not None else contextlib.nullcontext()
        with shared, prec.autocast():
            out = self._call(x)
            if self.last:
                return self.loss_fn(out, target) * (self.loss_scale * prec.loss_multiplier())
        # sent in the compute dtype where float32 (float64 as it is: autocast leaves it)
        return out.to(prec.dtype) if out.dtype == torch.float32 else out

    def new_step(self) -> None:
        """The weights changed: the next forward casts them again."""
        self._stale = True

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and (not self.first or self.split and x.is_floating_point()):
            # with a split backward the first stage too, so its I pass has an input to differentiate
            x = x.detach().requires_grad_(True)
        return x

    def trial(self, x: torch.Tensor, target: torch.Tensor | None) -> tuple:
        """One forward of a sample microbatch with its graph, nothing kept: (input, output, the
        output's gradient for an I) for `ppx.engine.weight_store.choose`; the stage's buffers and
        the generators are left as they were (a running mean moves as without the trial)."""
        if self.weights is not None and self._stale:
            self.weights.refresh()
        x = self._input(x)
        with untouched(self.module, x.device):
            out = self._run(x, target)
        return x, out, None if self.last else torch.ones_like(out)

    def forward(self, mb: int, x: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """Return the activation for the next stage, or (last stage) the scaled loss, detached."""
        if self.weights is not None and self._stale:  # the step's first forward: its weight copies
            self.weights.refresh()
            self._stale = False
        x = self._input(x)
        recomputed = self.training and self.recompute is not None
        if self.store is not None:  # a forward re-run in the I stores, not the one it re-runs
            self.store.begin(None if recomputed or mb in self.whole_mbs else mb)
        if recomputed:  # keeps x; the graph comes in backward
            out = self.recompute.forward(mb, lambda: self._run(x, target), [x, target])
            self.saved[mb] = (x, None)
        else:
            with torch.set_grad_enabled(self.training):
                out = self._run(x, target)
            if self.training:
                self.saved[mb] = (x, out)
        if self.last and self.precision is not None and self.precision.scaler is not None:
            return out.detach() / self.precision.loss_multiplier()
        return out.detach() if self.last else out

    def _graph(self, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, output) of ``mb`` with its graph: recomputed here, once, when the forward
        kept only its input (B, or I, whose graph W then reuses)."""
        x, out = self.saved[mb]
        if out is None:
            if self.store is not None:
                self.store.begin(None if mb in self.whole_mbs else mb)
            out = self.recompute.recompute(mb)
            self.saved[mb] = (x, out)
        return x, out

    def backward(self, mb: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """Accumulate parameter gradients; return d(loss)/d(input) for the previous stage."""
        # a storing stage's microbatch whose weights entered detached: I, then W (the rank's build
        # lists every B of a split stage in whole_mbs: this runs for a runner used on its own)
        if self.store is not None and mb not in self.whole_mbs:
            grad_in = self.backward_input(mb, grad_output)
            self.backward_weight(mb)
            return grad_in
        x, out = self._graph(mb)
        del self.saved[mb]
        if out.requires_grad:  # (a first stage of parameter-free units has nothing to differentiate)
            torch.autograd.backward(out, grad_output)
        return None if self.first else self._sent(x.grad)

    def _sent(self, grad_in: torch.Tensor | None) -> torch.Tensor:
        """The input's gradient, for the stage before; none reached it: one line."""
        if grad_in is None:
            raise RuntimeError(
                f"no gradient reaches stage {self.index}'s input (a unit that runs under torch.no_grad() or "
                "detaches, a loss that is not differentiable), and ppx sends one to the stage before: put that "
                "unit in the stage of the unit before it (pipeline.layers_per_stage)"
            )
        return grad_in

    def backward_input(self, mb: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """I: d(loss)/d(input) only, keeping the graph for the weight pass (or, storing: the
        small weights' gradients too, and each routed layer's input and output gradient; or,
        ``whole_in_input``, the whole backward)."""
        if self.whole_in_input:
            return self.backward(mb, grad_output)
        x, out = self._graph(mb)
        if self.store is not None:
            del self.saved[mb]
            grad_in = self.store.input_pass(mb, out, x, grad_output)
            return None if self.first else self._sent(grad_in)
        self.grad_outputs[mb] = grad_output
        if not x.requires_grad:  # integer input (token ids): nothing to differentiate
            return None
        if not out.requires_grad:
            return None if self.first else self._sent(None)
        (grad_in,) = torch.autograd.grad(out, [x], grad_output, retain_graph=True, allow_unused=True)
        return None if self.first else self._sent(grad_in)

    def backward_weight(self, mb: int) -> None:
        """W: accumulate the parameter gradients of microbatch ``mb``; frees its activations
        (``whole_in_input``: nothing, its I took them)."""
        if self.whole_in_input:
            return
        if self.store is not None:
            self.store.weight_pass(mb)
        else:
            x, out = self._graph(mb)  # recomputed already by its I (or here, if the schedule had none)
            del self.saved[mb]
            grad_output = self.grad_outputs.pop(mb)
            params = [p for p in self.module.parameters() if p.requires_grad]
            grads = torch.autograd.grad(out, params, grad_output, allow_unused=True)
            for p, g in zip(params, grads):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g
        if self.after_weight_pass is not None:
            self.after_weight_pass()

    def in_flight(self) -> int:
        """Microbatches whose activations (or stores) are held for a backward still to come."""
        if self.store is not None:
            return len(self.saved.keys() | self.store.microbatches())
        return len(self.saved)
