"""Every rank's per-step records to rank 0, without a collective between steps.

Each rank hands its step record to `RecordGatherer.put` and goes on with the next step; a
daemon thread gathers the records step by step to rank 0 over a gloo group of its own (one
collective per step, in that thread only), so no pipeline step waits for them. Rank 0 takes
the merged steps when it has a moment between steps (`ready`), and the rest at the end
(`rest`), which also raises what the thread hit (a rank that died, the group's timeout).
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch.distributed as dist
from torch.profiler import record_function

_DONE = object()


class RecordGatherer:
    def __init__(self, rank: int, world: int, steps: int, timeout_s: float):
        """Collective: every rank builds its gatherer at the same point."""
        self.rank, self.world, self.steps = rank, world, steps
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self._inbox: queue.Queue = queue.Queue()
        self._merged: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._gather, name="ppx-records", daemon=True)
        self._thread.start()

    def put(self, record: dict) -> None:
        """This rank's record of its next step (steps in order)."""
        self._inbox.put(record)

    def _gather(self) -> None:
        try:
            for step in range(self.steps):
                record = self._inbox.get()
                out = [None] * self.world if self.rank == 0 else None
                with record_function("ppx:gather_records"):
                    dist.gather_object(record, out, dst=0, group=self.group)
                if self.rank == 0:
                    self._merged.put((step, out))
        except BaseException as e:  # handed to the main thread by rest()
            self.error = e
        finally:
            self._merged.put(_DONE)

    def ready(self) -> list[tuple[int, list[dict]]]:
        """Rank 0: the steps merged so far, (step, every rank's record), without waiting."""
        out = []
        while True:
            try:
                got = self._merged.get_nowait()
            except queue.Empty:
                return out
            if got is _DONE:
                self._merged.put(_DONE)  # rest() still sees the end
                return out
            out.append(got)

    def rest(self) -> list[tuple[int, list[dict]]]:
        """Wait for every step's merge; rank 0 gets those not yet taken. Raises the thread's error."""
        out = []
        while (got := self._merged.get()) is not _DONE:
            out.append(got)
        self._thread.join()
        if self.error is not None:
            raise self.error
        return out
