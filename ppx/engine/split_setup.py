"""How each stage of a rank computes: its Linear layers routed through ppx where it needs them
(`ppx.engine.linears`: a mixed dtype's weight copies, a split backward's stores) and the way
its split backward gets its weight gradients (`ppx.engine.weight_store.choose`), decided once,
when the rank is built, on a sample microbatch."""

from __future__ import annotations

import torch

from ppx.engine.linears import route_layers
from ppx.engine.stage import StageRunner
from ppx.engine.weight_store import choose


class SampleMicrobatch:
    """A microbatch of the run's shapes for a trial forward: the data's own on the first and
    last stages (step 0's), elsewhere a fixed random activation of what the stage before hands
    on (``boundaries``: (shape, dtype) of each stage's output but the last's)."""

    def __init__(self, cfg, kind, mb_size: int, boundaries: list[tuple], device):
        self.cfg, self.kind, self.mb_size, self.boundaries = cfg, kind, mb_size, boundaries
        self.device = torch.device(device)

    def of(self, runner: StageRunner) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = target = None
        if runner.first or runner.last:
            x, target = self.kind.make_batch(self.cfg.model, self.cfg.train.seed, self.mb_size, 0)
        if not runner.first:
            shape, dtype = self.boundaries[runner.index - 1]
            x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
        return x.to(self.device), target.to(self.device) if runner.last else None


def set_up_split(cfg, runner: StageRunner, split: bool, sample: SampleMicrobatch) -> dict | None:
    """Route ``runner``'s layers where needed and choose its split backward's way (``split``:
    its schedule has I and W for it, in training); what summary.json reports of it, or None
    for a stage without a split backward."""
    weights = runner.weights
    copies = weights is not None and weights.dtype is not None
    mode = cfg.train.split_backward
    if not (copies or (split and mode != "graph")):
        return {"mode": "graph", "why": "train.split_backward=graph"} if split else None
    layers = route_layers(runner.module, weights)
    if not split:
        return None
    store, info = choose(mode, runner.module, layers, lambda: runner.trial(*sample.of(runner)), weights.storages)
    runner.store = store
    if not layers and info.get("why") and cfg.pipeline.split == "tracer":  # (the model's own has Linear layers)
        info["why"] = (
            "pipeline.split=tracer's GraphModules hold the Linear layers' weights, not the layers: nothing to store"
        )
    if store is None and not copies:  # nothing of ppx's needed on the layers: their own forward
        for layer in layers:
            layer.unroute()
    return info


def settle_input_copies(runners: dict[int, StageRunner], sample: SampleMicrobatch) -> None:
    """Whether each stage the stage before on its rank hands its input in place (a V's turn)
    changes that input in place (`StageRunner.copies_input`), found by a trial forward here
    where no trial found it yet: else step 0's first forward finds it on a copy, whose storage
    is not the one the stage before saved, and that microbatch holds the tensor twice where
    every later one holds it once (the peak a run measured, 8 KiB of 82 on a small CNN under
    ZB-V, above what it predicted from the later ones)."""
    for s, runner in runners.items():
        # (a recomputing stage's forward runs without its graph, as its trial would not: left to it)
        if s - 1 in runners and runner.copies_input is None and runner.recompute is None:
            try:
                runner.trial(*sample.of(runner))
            except Exception:  # (a module the random sample does not suit: step 0's first forward finds out)
                pass
