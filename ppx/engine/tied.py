"""Weights tied across stages (a model's ``tied_units``: GPT-2's token embedding and LM head),
their gradients summed every step, as Megatron sums its embedding's.

Each stage holding a unit of a tied group keeps its own copy of the weight (the same initial
values); after the step's backward, the copies' gradients are summed (on one rank, in stage
order; across ranks, one all-reduce over the ranks that hold them, a process group per group
and pipeline replica) and every copy gets the sum. The copies then take the same optimizer
step and stay equal, and the gradient is the unsplit model's, where one parameter's two uses
add up. Made on every rank at the same point: the process groups are collective."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class TiedGrads:
    """The tied groups this rank holds copies of: ``groups`` maps a name to this rank's
    (stage, parameter getter) pairs and the process group of the other ranks holding it."""

    def __init__(self, groups: dict):
        self.groups = groups

    @classmethod
    def build(cls, cfg, kind, schedule, rank: int, modules: dict[int, nn.Module], layout=None) -> TiedGrads | None:
        """The groups of ``kind.tied_units(cfg.model)`` on ``rank`` (pipeline rank); ``layout``
        (data parallel) places this replica's ranks; None when nothing is tied across stages."""
        tied = getattr(kind, "tied_units", None)
        units_of = tied(cfg.model) if tied is not None else {}
        if not units_of:
            return None
        from ppx import models

        ranges = models.split_of(cfg, schedule.num_stages)
        groups = {}
        for name, units in sorted(units_of.items()):
            stages = sorted({s for u in units for s, r in enumerate(ranges) if u in r})
            if len(stages) < 2:
                continue  # one stage holds every use: autograd sums them itself
            ranks = sorted({schedule.stage_to_rank[s] for s in stages})
            group = None
            if len(ranks) > 1 and dist.is_initialized():
                replicas = layout.data if layout is not None else 1
                for d in range(replicas):  # collective: every rank makes every group, in one order
                    members = [layout.global_rank(r, d) if layout is not None else r for r in ranks]
                    made = dist.new_group(members)
                    if layout is None or d == layout.dp_rank:
                        group = made
            mine = [s for s in stages if s in modules]
            if mine:
                groups[name] = (mine, group if rank in ranks else None)
        return cls(groups) if groups else None

    def sync(self, modules: dict[int, nn.Module]) -> None:
        """Every copy's gradient := the sum over every copy, this rank's and the others'."""
        for name, (stages, group) in self.groups.items():
            params = [modules[s].tied_parameters()[name] for s in stages]
            grads = [_local(p.grad) if p.grad is not None else None for p in params]
            like = next((g for g in grads if g is not None), None)
            if like is None:
                like = torch.zeros_like(_local(params[0].detach()))
            total = None
            for g in grads:  # in stage order
                if g is not None:
                    total = g.clone() if total is None else total + g
            total = total if total is not None else torch.zeros_like(like)
            if group is not None:
                dist.all_reduce(total, group=group)
            for p, g in zip(params, grads):
                if g is None:
                    p.grad = total.clone()
                else:
                    g.copy_(total)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (data parallel: a replica's, or its shard), else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t
