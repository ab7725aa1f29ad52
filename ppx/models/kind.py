"""The `ModelKind` protocol: what every model kind (a module of this package) provides."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ppx.models.action_clock import ActionClock


@runtime_checkable
class ModelKind(Protocol):
    """A model that splits into pipeline stages. ``cfg`` is the config's ``model`` section.

    Optional extras: ``block_name(cfg, block)`` (the submodule where a block begins, for
    ``pipeline.split=tracer``; list the kind in ``TRACEABLE``), ``calibrate(device)``
    (measure the device once, before any timed step) and ``tied_units(cfg)`` (units that hold
    a copy of one weight, by name, e.g. ``{"embedding": (0, last)}``: `ppx.engine.tied` sums
    their gradients every step), and ``SEEDS_UNITS = True`` for a kind whose units draw random
    numbers (dropout) and seed them with `ppx.models.seeding.seed_unit`: the runtime then keys
    each action by its microbatch, and ``MOVES_BUFFERS = True`` for a kind whose forward may
    move buffers (a running mean): a recomputed forward then runs on copies of the buffers its
    forward found (`ppx.engine.buffers`). A kind whose embedding and head are
    split like blocks lists how many such units it has in ``EXTRA_UNITS`` (`ppx.models`); its
    ``build_stage`` then gets a range of units (llama's: [embedding, blocks..., head]). A kind
    whose units hand on tensors of different shapes (your own module's) gives, instead of
    ``boundary``, ``unit_outputs(cfg, microbatch_size)``: each unit's output (shape, dtype) but
    the last's; each stage then receives its own (`ppx.models.handed_on`)."""

    def build_stage(
        self, cfg, seed: int, stage: int, num_stages: int, blocks: range, clock: ActionClock | None = None
    ) -> nn.Module:
        """Stage ``stage`` of ``num_stages``, holding ``blocks``; the same weights for a block
        whatever the split. ``clock`` is the executor's (for models whose cost is set)."""

    def make_batch(self, cfg, seed: int, batch_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s whole batch (inputs, targets): the same for a seed on every run."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of one microbatch (a mean over it)."""

    def boundary(self, cfg, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of the activation passed between stages (every stage's alike)."""
