"""Point-to-point transport: one batch of schedule comm actions at a time.

On NCCL a batch goes out as one ``batch_isend_irecv`` group, so a send and a receive to the
same peer (1F1B's send-forward/receive-backward pair) progress together. On gloo, where
requests are independent anyway, activations and gradients travel on two separate process
groups (one socket per direction of flow): a pair of neighbours then never pushes both
ways through one socket at the same moment, which cuts the median hand-off latency.
Requests go straight to the process group object (``ProcessGroup.send``/``recv``, the same
c10d ops ``dist.isend`` ends in), skipping the Python checks ``dist.isend`` repeats on every
call, which are costly on a shared CPU machine whose caches went cold while a stage computed.
The measurements behind both choices are in docs/benchmarks.md ("Measurements behind design
choices").
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class P2P:
    """Posts batches of sends/receives. ``forward`` and ``backward`` are the process groups
    for activations and gradients (None = the default group). Peers are the schedule's
    ranks; ``ranks`` maps them to global ranks (data parallel: this replica's pipeline)."""

    def __init__(self, forward=None, backward=None, ranks=None):
        self.groups = {"F": forward, "B": backward}
        self.ranks = ranks
        self.coalesce = dist.is_initialized() and dist.get_backend(forward) == "nccl"
        self._direct = {}  # (kind, global peer) -> (process group, peer's rank in it)

    @classmethod
    def for_backend(cls, backend: str, ranks=None) -> P2P:
        """Two extra gloo groups on gloo; the default group on NCCL. Collective: call on every
        rank. ``ranks``: as the constructor's."""
        if backend == "gloo" and dist.get_world_size() > 1:
            return cls(dist.new_group(backend="gloo"), dist.new_group(backend="gloo"), ranks)
        return cls(ranks=ranks)

    def post(self, ops: list[tuple[bool, torch.Tensor, int, str]]) -> list:
        """``ops`` = [(is_send, tensor, peer rank, "F" | "B")]; returns the requests to wait on."""
        if self.ranks is not None:
            ops = [(send, t, self.ranks[peer], kind) for send, t, peer, kind in ops]
        if self.coalesce:
            g = self.groups["F"]
            return dist.batch_isend_irecv(
                [dist.P2POp(dist.isend if send else dist.irecv, t, peer, g) for send, t, peer, _ in ops]
            )
        works = []
        for send, t, peer, kind in ops:
            target = self._direct.get((kind, peer))
            if target is None:
                group = self.groups[kind] or dist.group.WORLD
                target = self._direct[(kind, peer)] = (group, dist.get_group_rank(group, peer))
            group, group_peer = target
            works.append(group.send([t], group_peer, 0) if send else group.recv([t], group_peer, 0))
        return works
