"""The known-cost model: each stage's forward and backward take exactly ``model.fwd_ms`` and
``model.bwd_ms`` per microbatch (or, with ``model.cost_per=layer``, the sums of those per-layer
costs over the stage's layers), so measured step time and bubble can be held against the
exact ideal (m+p-1)(t_f+t_b).

On CPU a stage charges its time to the running action and the runtime sleeps it out when the
action ends (`ppx.models.action_clock`), so the action as timed lasts exactly that long with any
number of ranks on any number of cores, framework overhead included; on CUDA it
spins the GPU with ``torch.cuda._sleep`` for the same time, so CUDA events see it as
compute. The arithmetic is y = x * w with one weight vector per stage, so gradients stay
exact like any other model's.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ppx.errors import UserError
from ppx.models.action_clock import ActionClock, sleep_until
from ppx.models.costs import blocks_cost_ms, per_layer, stage_costs_ms
from ppx.models.seeding import BLOCK, DATA, generator, seeded
from ppx.models.split import split_layers

_CYCLES_PER_MS: dict[int, float] = {}


def calibrate(device: torch.device) -> None:
    """Measure the GPU's spin cycles per ms once per device, when the stage is built: the
    calibration synchronizes, which must not happen inside a timed step. An idle GPU's clocks
    take a few hundred ms of work to ramp up (an H100 idles at 345 MHz), and a rate measured
    before they settle makes every later spin short (2.6 % on the first run of an H100): it
    spins until two rounds in a row agree within 0.2 %, for at most about 2 s."""
    if device.type != "cuda" or device.index in _CYCLES_PER_MS:
        return
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def cycles_per_ms(cycles: int) -> float:
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            return cycles / start.elapsed_time(end)

        first = cycles_per_ms(1_000_000)  # a first estimate, from a cold start
        rate = 0.0
        for _ in range(12):  # each round: about 100 ms of spinning, then five 10 ms samples
            cycles_per_ms(int(100 * (rate or first)))
            now = statistics.median(cycles_per_ms(int(10 * (rate or first))) for _ in range(5))
            settled = rate > 0 and abs(now / rate - 1) < 0.002
            rate = now
            if settled:
                break
        _CYCLES_PER_MS[device.index] = rate


def _spin_gpu(ms: float, device: torch.device) -> None:
    calibrate(device)  # a no-op once the stage's build calibrated this device
    torch.cuda._sleep(int(ms * _CYCLES_PER_MS[device.index]))


def _take(ms: float, device: torch.device, entry: float, clock: ActionClock | None) -> None:
    """Occupy ``ms``: on CUDA a GPU spin on the stream; on CPU a charge to the running
    action (the runtime waits it out when the action ends, so the whole action lasts ``ms``),
    or, outside any action (a one-process reference), a wait counted from ``entry``."""
    if ms <= 0:
        return
    if device.type == "cuda":
        _spin_gpu(ms, device)
    elif clock is None or not clock.charge(ms / 1000.0):
        sleep_until(entry + ms / 1000.0)


class _KnownCost(torch.autograd.Function):
    """y = x * w_0 * w_1 * ..., block after block, in one autograd node (few nodes = little
    framework overhead). Block by block, as a chain of stages computes it: the same floats
    however the blocks are cut into stages (multiplying the weights first rounded by the
    stage's block count, so zbv's losses differed from 1f1b's by 1e-7). Saves the input; the
    backward computes each block's input again (``hidden`` numbers a row)."""

    @staticmethod
    def forward(ctx, x, clock: ActionClock | None, fwd_ms: float, bwd_ms: float, wgrad_ms: float, *weights):
        entry = time.perf_counter()
        y = x
        for w in weights:
            y = y * w
        ctx.save_for_backward(x, *weights)
        ctx.bwd_ms, ctx.wgrad_ms, ctx.clock = bwd_ms, wgrad_ms, clock
        if clock is None or clock.recomputing != "selective":  # selective keeps the output its cost stands for
            _take(fwd_ms, x.device, entry, clock)
        return y

    @staticmethod
    def backward(ctx, grad):
        entry = time.perf_counter()
        x, *weights = ctx.saved_tensors
        part = ctx.clock.part if ctx.clock is not None else "full"  # "full" (B), "input" (I) or "weight" (W)
        inputs = [x]  # each block's input
        for w in weights[:-1]:
            inputs.append(inputs[-1] * w)
        grads = [None] * len(weights)
        g = grad
        for k in reversed(range(len(weights))):  # from the last block back, as autograd runs a chain
            if part != "input":
                grads[k] = (g * inputs[k]).sum(0)
            if part != "weight" or k:
                g = g * weights[k]
        gx = g if part != "weight" else None
        cost = {"full": ctx.bwd_ms + ctx.wgrad_ms, "input": ctx.bwd_ms, "weight": ctx.wgrad_ms}[part]
        _take(cost, grad.device, entry, ctx.clock)
        return (gx, None, None, None, None, *grads)


class KnownCostStage(nn.Module):
    """The blocks of one stage (one weight vector each), costing ``fwd_ms``/``bwd_ms`` in all."""

    def __init__(
        self,
        hidden: int,
        fwd_ms: float,
        bwd_ms: float,
        wgrad_ms: float,
        seed: int,
        blocks: range,
        clock: ActionClock | None = None,
    ):
        super().__init__()
        weights = []
        for i in blocks:
            with seeded(seed, BLOCK + i):
                weights.append(nn.Parameter(1.0 + 0.01 * torch.randn(hidden)))
        self.weights = nn.ParameterList(weights)
        self.fwd_ms, self.bwd_ms, self.wgrad_ms = fwd_ms, bwd_ms, wgrad_ms
        self.clock = clock  # the executor's: charges go to its running action (None: sleep here)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _KnownCost.apply(x, self.clock, self.fwd_ms, self.bwd_ms, self.wgrad_ms, *self.weights)


def stage_cost_ms(cfg, stage: int, num_stages: int, blocks: range | None = None) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) ms of ``stage`` of ``num_stages``, holding
    ``blocks``, from the checked costs (`ppx.models.costs`). ``model.cost_per=layer``: the
    sums of its blocks' per-layer costs (the whole model's in a one-stage build). Per stage:
    one value is every stage's; a list needs one value per stage, except in a one-stage build
    of the whole model (the single-process reference), which costs the sum of the stages."""
    if per_layer(cfg):
        if blocks is None:
            blocks = split_layers(cfg.layers, num_stages)[stage]
        return blocks_cost_ms(cfg, blocks)
    out = []
    for key, values in zip(("fwd_ms", "bwd_ms", "wgrad_ms"), stage_costs_ms(cfg, None)):
        if len(values) == 1:
            out.append(values[0])
        elif len(values) == num_stages:
            out.append(values[stage])
        elif num_stages == 1:
            out.append(sum(values))
        else:
            raise UserError(
                f"model.{key} has {len(values)} values for {num_stages} stages (give one, or one per stage)"
            )
    return tuple(out)


def build_stage(
    cfg, seed: int, stage: int, num_stages: int, blocks: range, clock: ActionClock | None = None
) -> nn.Module:
    """Stage ``stage`` holds ``blocks`` (like any model) but its cost is set, per stage or as
    the sum of its blocks' (``model.cost_per``); its modelled time is charged to ``clock``'s
    running action (None: waited out in place)."""
    fwd, bwd, wgrad = stage_cost_ms(cfg, stage, num_stages, blocks)
    return KnownCostStage(cfg.hidden, fwd, bwd, wgrad, seed, blocks, clock)


def make_batch(cfg, seed: int, batch_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(seed, DATA + 16 * step)
    return torch.randn(batch_size, cfg.hidden, generator=g), torch.zeros(batch_size, cfg.hidden)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def boundary(cfg, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
    return (microbatch_size, cfg.hidden), torch.float32
