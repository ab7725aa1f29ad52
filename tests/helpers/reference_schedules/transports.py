"""The simulator's two transports: when a posted send or receive completes.

``nccl`` is the strict one: each run of consecutive comm actions is one batch, a rank's
batches complete in order (one stream), an op completes only once the peer's matching op
sits in that peer's active batch, and a compute action waits for the whole batch that
receives its input. A list that passes here also passes on gloo, which is looser.
``gloo`` is how ppx's runtime runs on gloo: every send and receive completes on its own,
``p2p`` after both ends are posted, receives may be posted ``recv_lookahead`` compute
actions early (`receive_early`), and a compute action waits only for its own input.

Both see the same posted batches (`Batch`, its `CommOp`s with their posting times) from the
simulator, which executes the compiled program (`ppx.schedules.comms.program`) and asks its
transport: when may a received tensor be used (`ready`), since when did it move (`moving`),
when is a batch done (`complete`); `advance` moves what the transport moves between
programs' steps.
"""

from __future__ import annotations

from ppx.errors import ScheduleError


class CommOp:
    """One posted send or receive; ``peer`` is the matching op on the other rank."""

    __slots__ = ("rank", "index", "action", "batch", "peer", "done", "posted", "went")

    def __init__(self, rank, index, action, batch):
        self.rank, self.index, self.action, self.batch = rank, index, action, batch
        self.peer: CommOp | None = None
        self.done = None  # completion time
        self.posted = None  # when its rank posted it
        self.went = None  # nccl: when both ends' batches were active, so the message could move


class Batch:
    """One ``post`` item's ops, posted one after another."""

    __slots__ = ("ops", "start", "posted", "active", "complete")

    def __init__(self):
        self.ops: list[CommOp] = []
        self.start = self.posted = self.active = self.complete = None  # start: when its posting began


class Transport:
    """Completion rules; ``batches[r]`` are rank r's batches in program order."""

    takes_lookahead = True  # whether receives may be posted early (`receive_early`)

    def __init__(self, batches: list[list[Batch]], costs):
        self.batches, self.costs = batches, costs

    def posted(self, batch: Batch) -> None:
        """``batch`` has just been posted (its ops' ``posted`` times set)."""

    def advance(self) -> bool:
        """Complete what can complete between the programs' steps; True if anything moved."""
        return False

    def ready(self, recv: CommOp) -> float | None:
        """When the compute consuming ``recv`` may start, or None while unknown."""
        raise NotImplementedError

    def moving(self, recv: CommOp) -> float:
        """Since when the tensor of ``recv`` was on its way (a run's transfer time starts there)."""
        raise NotImplementedError

    def complete(self, batch: Batch) -> float | None:
        """When every op of ``batch`` has completed, or None."""
        raise NotImplementedError


class Nccl(Transport):
    """One stream per rank: a batch becomes active once posted and its predecessor is
    complete; an op completes ``p2p`` after both ends' batches are active; a received
    tensor is ready when its whole batch is complete. ``recv_lookahead`` is ignored: the
    batches are the lowered list's."""

    takes_lookahead = False

    def __init__(self, batches, costs):
        super().__init__(batches, costs)
        self.head = [0] * len(batches)  # index of each rank's first incomplete batch

    def advance(self) -> bool:
        """Activate each rank's head batch, complete matched ops, retire finished batches."""
        progress = False
        for r, bs in enumerate(self.batches):
            while self.head[r] < len(bs):
                b = bs[self.head[r]]
                if b.posted is None:
                    break
                if b.active is None:
                    prev = bs[self.head[r] - 1].complete if self.head[r] > 0 else 0.0
                    b.active = max(b.posted, prev)
                    progress = True
                for op in b.ops:
                    peer = op.peer
                    if op.done is None and peer.batch.active is not None and peer.done is None:
                        op.went = peer.went = max(b.active, peer.batch.active)
                        op.done = peer.done = op.went + self.costs.latency()
                        progress = True
                if any(op.done is None for op in b.ops):
                    break
                b.complete = max(op.done for op in b.ops)
                self.head[r] += 1
                progress = True
        return progress

    def ready(self, recv):
        return recv.batch.complete

    def moving(self, recv):
        return recv.went  # waiting on the rest of the batch after the message arrived is idle

    def complete(self, batch):
        return batch.complete


class Gloo(Transport):
    """Each op on its own: done ``p2p`` after both ends are posted; a received tensor is
    ready when its own receive is done, having moved since its sender began posting."""

    def posted(self, batch):
        for op in batch.ops:
            if op.peer.posted is not None:
                op.done = op.peer.done = max(op.posted, op.peer.posted) + self.costs.latency()

    def ready(self, recv):
        return recv.done

    def moving(self, recv):
        return recv.peer.batch.start

    def complete(self, batch):
        return max(op.done for op in batch.ops) if all(op.done is not None for op in batch.ops) else None


TRANSPORTS: dict[str, type[Transport]] = {"nccl": Nccl, "gloo": Gloo}


def transport_class(name: str) -> type[Transport]:
    """The transport called ``name``; ScheduleError for an unknown one."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise ScheduleError(f"unknown transport {name!r}; choose nccl or gloo") from None
