"""In-process microbenchmarks of the instrumentation's own cost (no processes, no noise from
peers): seconds per program item for the timer, and per microbatch forward+backward for the
memory counters on the benchmark MLP's stage."""

from __future__ import annotations

import time

import torch

from ppx import config
from ppx.engine.rank import build_stage_modules
from ppx.engine.stage import StageRunner
from ppx.measure.memory import MemoryTracker
from ppx.measure.timers import WallTimer
from ppx.schedules.comms.program import Item
from ppx.schedules.ir.action import Action, Op


def timer_cost_s(n: int = 200_000) -> float:
    timer, item = WallTimer(), Item("compute", (Action(0, Op.F, 0),), "0F0")
    timer.begin_step(0)
    start = time.perf_counter()
    for _ in range(n):
        timer.before(item)
        timer.after(item)
    return (time.perf_counter() - start) / n


def memory_cost_s(overrides: list[str], reps: int = 300) -> float:
    """Extra seconds per microbatch (forward + backward) with the memory counters on."""
    torch.set_num_threads(1)
    cfg = config.load(None, overrides + ["pipeline.stages=4"])
    module = build_stage_modules(cfg, 4, [1], "cpu")[1]
    runner = StageRunner(1, module, False, False, None, 1.0, True)
    tracker = MemoryTracker({1: module}, True, runner.in_flight, torch.device("cpu"))
    mb = cfg.train.batch_size // cfg.pipeline.microbatches
    f_item, b_item = Item("compute", (Action(1, Op.F, 0),), "1F0"), Item("compute", (Action(1, Op.B, 0),), "1B0")

    def one(track: bool) -> float:
        x = torch.randn(mb, cfg.model.hidden)
        start = time.perf_counter()
        if track:
            tracker.before(f_item)
        out = runner.forward(0, x, None)
        if track:
            tracker.after(f_item)
        runner.backward(0, torch.ones_like(out))
        if track:
            tracker.after(b_item)
        return time.perf_counter() - start

    for _ in range(20):
        one(True), one(False)
    off, on = [], []
    for _ in range(reps):
        off.append(one(False))
        on.append(one(True))
    off.sort(), on.sort()
    return on[reps // 2] - off[reps // 2]
