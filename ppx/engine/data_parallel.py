"""Data parallelism across pipeline replicas (``parallel.data`` = d > 1).

The world is a DeviceMesh ``(pp, dp)``: global rank = pipeline rank x d + replica, so the d
replicas of a stage sit on consecutive ranks (one node, where the reduction is cheapest) and
the pipeline runs across them. Each stage module is wrapped by torch's own data-parallel
machinery over the ``dp`` dimension, as torchtitan does: ``replicate`` (gradients
all-reduced) or, with ``parallel.data_shard``, FSDP2 ``fully_shard`` (parameters sharded,
gradients reduce-scattered), parameters kept unsharded through the step. Gradients accumulate
locally over the microbatches; the reduction of a stage runs once, as the program's
``reduce`` item right after that stage's last backward (and its last gradient send), the
way torch.distributed.pipelining's REDUCE_GRAD does, so it overlaps the other stages' and
ranks' drain. ppx writes no collective of its own here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Layout:
    """Where global rank ``rank`` sits among ``stages`` pipeline ranks x ``data`` replicas."""

    stages: int
    data: int
    rank: int

    @property
    def world(self) -> int:
        return self.stages * self.data

    @property
    def pp_rank(self) -> int:
        """This rank's place in its pipeline (the schedule's rank)."""
        return self.rank // self.data

    @property
    def dp_rank(self) -> int:
        """Which replica of the pipeline this rank belongs to."""
        return self.rank % self.data

    def global_rank(self, pp_rank: int, dp_rank: int | None = None) -> int:
        """The global rank of pipeline rank ``pp_rank`` in replica ``dp_rank`` (default: ours)."""
        return pp_rank * self.data + (self.dp_rank if dp_rank is None else dp_rank)

    def share(self, batch: torch.Tensor) -> torch.Tensor:
        """This replica's contiguous share of a global batch (dim 0)."""
        return batch.chunk(self.data)[self.dp_rank]

    @property
    def pipeline_ranks(self) -> list[int]:
        """The global ranks of this replica's pipeline, by pipeline rank."""
        return [self.global_rank(r) for r in range(self.stages)]


class DataParallel:
    """The ``dp`` mesh dimension and the stage modules wrapped over it. Collective: every rank
    builds it at the same point (the mesh makes its process groups)."""

    def __init__(self, layout: Layout, device: torch.device, shard: bool):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (layout.stages, layout.data), mesh_dim_names=("pp", "dp"))
        self.layout, self.mesh, self.shard = layout, mesh["dp"], shard
        self.modules: dict[int, nn.Module] = {}

    def wrap(self, modules: dict[int, nn.Module], param_dtype: torch.dtype | None = None) -> None:
        """Wrap each stage module (after it is on its device) over the replicas. ``param_dtype``
        (a mixed ``train.dtype``): FSDP2's mixed-precision policy unshards the parameters in
        it, once per step (they stay unsharded until the reduction), and reduces in fp32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
        if self.shard:
            from torch.distributed.fsdp import fully_shard

            for m in modules.values():  # unsharded from the first forward to the reduction
                fully_shard(m, mesh=self.mesh, reshard_after_forward=False, mp_policy=policy)
            self._state_of = fully_shard.state
        else:
            from torch.distributed._composable.replicate_with_fsdp import replicate

            for m in modules.values():
                replicate(m, mesh=self.mesh, mp_policy=policy)
            self._state_of = replicate.state
        self.modules = modules

    def begin_step(self) -> None:
        """Accumulate gradients locally until each stage's reduction."""
        for m in self.modules.values():
            m.set_is_last_backward(False)
            m.set_reshard_after_backward(False)
            m.set_requires_gradient_sync(False)

    def accumulate(self, stage: int) -> None:
        """After a weight pass outside autograd (a split backward's W): the gradients it added
        join FSDP2's fp32 accumulator now, as FSDP2's post-backward moves an autograd
        backward's after each microbatch (mixed precision only; else nothing to move). Without
        it two W's in a row would sum in the compute dtype first, and the losses would differ
        from a whole backward's by its rounding."""
        for group in self._param_groups(stage):
            for param in group.fsdp_params:
                param.accumulate_unsharded_grad_if_needed()
                param.to_accumulated_grad_if_needed()

    def _param_groups(self, stage: int):
        """FSDP2's parameter groups of stage ``stage``'s module."""
        state = self._state_of(self.modules[stage])
        return [group for s in state._state_ctx.all_states for group in s._fsdp_param_groups]

    def reduce(self, stage: int) -> None:
        """Reduce stage ``stage``'s accumulated gradients across the replicas (averaged): its
        FSDP post-backward, which the split or manual backward passes never triggered."""
        m = self.modules[stage]
        m.set_is_last_backward(True)
        m.set_reshard_after_backward(True)
        m.set_requires_gradient_sync(True)
        for group in self._param_groups(stage):
            group.post_backward()
        self._state_of(m)._root_post_backward_final_callback()
