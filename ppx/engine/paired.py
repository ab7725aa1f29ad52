"""``run.paired``: the configs a run's steps alternate with, step by step, in its processes.

Each entry (`ppx.config.paired.variants`) gets a pipeline of its own on this rank, built from
its config and the run's seed, and its own optimizer. Every step of the run has one step of
each beside it: before the run's on odd steps and after it on even ones (so that neither
always follows the other's optimizer step), each started on every rank at the same instant as
the run's are, its data and zeroed gradients made before, and timed as
`ppx.engine.loop.timed_step` times the run's (start to end on this rank, the GPU's work done).
It carries instruments of its own as the run's config sets them (timers, memory counters,
profiler labels: ``PAIRED<k>:<action>``), so the two steps pay for the same observers; of what
they record only each action's duration is kept, over the steps the run's own costs come from
(its timeline's: `kept`), with how each split stage ran its W (first step), the memory
counters' bytes per stage (where they counted) and, under fp16, whether an overflow skipped
its optimizer step, so that
``ppx plan --from-run`` can price what the run did not run from what an entry ran beside it
(`ppx.commands.run_costs`). Each step is one ``ppx:paired <entry>`` mark in a trace, outside
the run's ``ProfilerStep#``. The watchdog observes its actions as it does the run's, under
names that say whose (``paired 'pipeline.schedule=zb_h1': 1F0``). Its gradients are dropped
after its optimizer step, so between its steps it holds its weights and optimizer state only;
they share the process's memory with the run's, and its peak (``peak_memory_bytes``) counts
them."""

from __future__ import annotations

import math
import time

import torch

from ppx.config.paired import variants
from ppx.config.resolve import resolve_schedule
from ppx.engine.precision import step_optimizer
from ppx.measure.clock import start_together
from ppx.measure.instruments import Instruments
from ppx.measure.paired import MEMORY
from ppx.measure.prediction import action_durations
from ppx.measure.profiler import RecordFunctions
from ppx.measure.spans import first_timeline_step


class PairedLossNotFinite(RuntimeError):
    """An entry's loss is nan or inf: its steps beside the run's would time NaN arithmetic."""


class _Named:
    """The watchdog, told an entry's actions by names that say whose."""

    def __init__(self, watchdog, entry: str):
        self.watchdog, self.prefix = watchdog, f"paired {entry!r}: "

    def before(self, item) -> None:
        self.watchdog.before(_Item(item.kind, self.prefix + item.label))

    def after(self, item) -> None:
        self.watchdog.after(_Item(item.kind, self.prefix + item.label))


class _Item:
    __slots__ = ("kind", "label")

    def __init__(self, kind: str, label: str):
        self.kind, self.label = kind, label


class PairedSteps:
    """This rank's share of every ``run.paired`` entry's pipeline, and its optimizer."""

    def __init__(self, cfg, layout, device, backend: str, watchdog):
        from ppx.engine.loop import build_share, make_optimizer

        self.device, self.watchdog = device, watchdog
        self.first_kept = first_timeline_step(cfg)  # the steps whose action durations are kept: the run's timeline's
        self.shares = []
        for k, (entry, other) in enumerate(variants(cfg)):
            schedule = resolve_schedule(other)
            pipe = build_share(other, schedule, layout, device, backend, [_Named(watchdog, entry)])
            inst = Instruments(other, pipe, device)
            if inst.labels is not None:
                inst.labels = RecordFunctions(f"PAIRED{k}:")
            pipe.observers.extend(inst.observers)
            self.shares.append((entry, pipe, inst, make_optimizer(other, pipe) if schedule.training else None))

    def run(self, step: int, offset: float, ctrl, prof) -> list[list]:
        """One step of each entry's pipeline: [start, end (rank 0's clock, seconds), loss (None
        off the last stage), kept (`kept`)] each, in ``run.paired``'s order."""
        out = []
        for entry, pipe, inst, opt in self.shares:
            self.watchdog.phase(f"paired step ({entry})", step)
            with prof.label(f"ppx:paired {entry}"):
                out.append(self._one(step, offset, ctrl, pipe, inst, opt))
            loss = out[-1][2]
            if loss is not None and not math.isfinite(loss):
                raise PairedLossNotFinite(f"run.paired {entry!r}: the loss is {loss} at step {step}; the run stops")
        return out

    def _one(self, step: int, offset: float, ctrl, pipe, inst, opt) -> list:
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
        stepped = None
        if opt is not None:
            stepped = step_optimizer(pipe, opt, self.device)
            opt.zero_grad(set_to_none=True)  # between its steps, weights and optimizer state only
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        record, spans = inst.end_step(step)  # (only `kept`'s part of them: the instruments are there to cost the same)
        return [t0 + offset, t1 + offset, loss, self.kept(step, pipe, record, spans, stepped)]

    def kept(self, step: int, pipe, record: dict, spans, stepped: bool | None = None) -> dict | None:
        """What is kept of an entry's step on this rank: each compute action's seconds
        (``action_s``: "<stage><op>" -> [seconds]) in the run's timeline steps, how each split
        stage ran its W (``split_backward``, first step), where the memory counters counted,
        the bytes a microbatch saved and held from I to W per stage, and under fp16 loss
        scaling whether its optimizer stepped (``optimizer_stepped``: False on an overflow, as
        the run's own records say); None where nothing is."""
        out = {k: record[k] for k in MEMORY if record.get(k)}
        if stepped is not None and pipe.precision is not None and pipe.precision.scaler is not None:
            out["optimizer_stepped"] = stepped
        if step >= self.first_kept and spans is not None:
            out["action_s"] = action_durations(spans)
        if step == 0 and pipe.split_backward:
            out["split_backward"] = {str(s): v for s, v in pipe.split_backward.items() if v}
        return out or None
