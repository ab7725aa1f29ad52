"""``run.paired``: the configs a run's steps alternate with, step by step, in its processes.

Each entry (`ppx.config.paired.variants`) gets a pipeline of its own on this rank, built from
its config and the run's seed, and its own optimizer. Every step of the run has one step of
each beside it: before the run's on odd steps and after it on even ones (so that neither
always follows the other's optimizer step), each started on every rank at the same instant as
the run's are, its data and zeroed gradients made before, and timed as
`ppx.engine.loop.timed_step` times the run's (start to end on this rank, the GPU's work done).
It carries instruments of its own as the run's config sets them (timers, memory counters), so
the two steps pay for the same observers; what they record is not kept. The watchdog observes
its actions as it does the run's. The profiler's steps are the run's alone."""

from __future__ import annotations

import time

import torch

from ppx.config.paired import variants
from ppx.config.resolve import resolve_schedule
from ppx.engine.precision import step_optimizer
from ppx.measure.clock import start_together
from ppx.measure.instruments import Instruments


class PairedSteps:
    """This rank's share of every ``run.paired`` entry's pipeline, and its optimizer."""

    def __init__(self, cfg, layout, device, backend: str, watchdog):
        from ppx.engine.loop import build_share, make_optimizer

        self.device, self.watchdog = device, watchdog
        self.shares = []
        for entry, other in variants(cfg):
            schedule = resolve_schedule(other)
            pipe = build_share(other, schedule, layout, device, backend, [watchdog])
            inst = Instruments(other, pipe, device)
            pipe.observers.extend(inst.observers)
            self.shares.append((entry, pipe, inst, make_optimizer(other, pipe) if schedule.training else None))

    def run(self, step: int, offset: float, ctrl) -> list[list]:
        """One step of each entry's pipeline: [start, end (rank 0's clock, seconds), loss (None
        off the last stage)] each, in ``run.paired``'s order."""
        out = []
        for entry, pipe, inst, opt in self.shares:
            self.watchdog.phase(f"paired step ({entry})", step)
            batch = pipe.microbatches(step)
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            inst.begin_step(step)
            start_together(offset, ctrl)
            t0 = time.perf_counter()
            loss = pipe.step(step, batch)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t1 = time.perf_counter()
            if opt is not None:
                step_optimizer(pipe, opt, self.device)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            inst.end_step(step)  # (its records are not kept: the instruments are there to cost the same)
            out.append([t0 + offset, t1 + offset, loss])
        return out
