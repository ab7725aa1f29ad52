"""Instrumentation that wraps the runtime's actions: timers, memory counters, profiler labels.

`Instruments` builds what the config switches on and exposes it as observers plus per-step
``begin_step``/``end_step`` hooks; everything switched off is simply absent.
"""

from __future__ import annotations

import torch

from ppx.measure.memory import MemoryTracker
from ppx.measure.metrics import span_totals
from ppx.measure.profiler import RecordFunctions
from ppx.measure.spans import COMM, COMPUTE, DP_COMM, WAIT, Span
from ppx.measure.timers import CudaTimer, WallTimer


class Instruments:
    def __init__(self, cfg, pipe, device: torch.device):
        """``pipe``: the rank's share (`ppx.engine.rank.StageShare`: modules, schedule, in_flight,
        held_by_store, held_with_graph, weight_copies, whole_stages)."""
        ins = cfg.instrument
        self.timer = None
        if ins.timers:
            self.timer = CudaTimer(device) if device.type == "cuda" else WallTimer()
        self.memory = None
        if ins.memory:
            self.memory = MemoryTracker(  # (ppx's runtime: a storing stage's I frees its graph, W its stores)
                pipe.modules,
                pipe.schedule.training,
                pipe.in_flight,
                device,
                pipe.held_by_store,
                pipe.weight_copies(),
                ins.memory_steps,
                pipe.whole_stages(),
                pipe.held_with_graph,
            )
        self.labels = RecordFunctions() if cfg.profile.enabled else None

    @property
    def observers(self) -> list:
        """Outermost first: labels enclose memory hooks, which enclose the timed region."""
        return [o for o in (self.labels, self.memory, self.timer) if o is not None]

    def begin_step(self, step: int) -> None:
        for o in (self.memory, self.timer):
            if o is not None:
                o.begin_step(step)

    def end_step(self, step: int) -> tuple[dict, list[Span] | None]:
        """(this rank's step record: seconds per category and memory peaks, the raw spans on
        this process's clock)."""
        record: dict = {"compute_s": None, "comm_s": None, "dp_comm_s": None, "wait_s": None}
        spans = None
        if self.timer is not None:
            spans = self.timer.end_step(step)
            totals = span_totals(spans)
            record.update(
                compute_s=totals[COMPUTE], comm_s=totals[COMM], dp_comm_s=totals[DP_COMM], wait_s=totals[WAIT]
            )
        if self.memory is not None:
            record.update(self.memory.end_step(step))
        return record, spans
