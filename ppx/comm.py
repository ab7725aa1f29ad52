"""Point-to-point transport: one ``batch_isend_irecv`` per batch of schedule comm actions."""

from __future__ import annotations

import torch
import torch.distributed as dist


class P2P:
    """Posts batches of sends/receives between ranks of ``group`` (default: the world)."""

    def __init__(self, group=None):
        self.group = group

    def post(self, ops: list[tuple[bool, torch.Tensor, int]]) -> list:
        """``ops`` = [(is_send, tensor, peer rank)]; returns the requests to wait on.

        All ops go out in one batch, so a send and a receive to the same peer (1F1B's
        send-forward/receive-backward pair) progress together and cannot deadlock."""
        p2p = [dist.P2POp(dist.isend if send else dist.irecv, t, peer, self.group) for send, t, peer in ops]
        return dist.batch_isend_irecv(p2p)
