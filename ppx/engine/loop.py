"""The training loop of one rank: its share of the pipeline built and instrumented, timed
steps, and every step's per-rank records sent to rank 0's report by a background thread (no
collective between steps but ``start_together``'s, which starts every rank's step at once,
and, in fp16, the optimizer step's agreement on an overflow)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ppx.engine.comm import P2P
from ppx.engine.data_parallel import DataParallel, Layout
from ppx.engine.garbage import StepCollector
from ppx.engine.precision import step_optimizer
from ppx.engine.rank import build_rank
from ppx.engine.records import RecordGatherer
from ppx.measure.clock import offset_to_rank0, start_together
from ppx.measure.instruments import Instruments
from ppx.measure.profiler import make_profiler
from ppx.measure.replicas import merge_replicas
from ppx.schedules import registry
from ppx.schedules.ir.schedule import Schedule


class LossNotFinite(RuntimeError):
    """A step's loss is nan or inf: what would follow trains nothing (and times NaN arithmetic)."""


def build_share(cfg, schedule: Schedule, layout: Layout, device, backend: str, observers):
    """This rank's share of the pipeline, run by ppx's runtime or torch's; with
    ``parallel.data`` > 1, one replica's (its modules wrapped over the replicas)."""
    if registry.runs_on_torch(cfg.pipeline.schedule, cfg.pipeline.executor):
        from ppx.engine.torch_executor import TorchPipeline

        return TorchPipeline(cfg, schedule, layout.pp_rank, device, observers)
    dp = None
    if layout.data > 1:
        dp = DataParallel(layout, torch.device(device), cfg.parallel.data_shard)
    comm = P2P.for_backend(backend, layout.pipeline_ranks if layout.data > 1 else None)
    return build_rank(cfg, schedule, layout.pp_rank, device, comm, observers, dp)


def train(
    cfg,
    schedule: Schedule,
    run_dir: Path,
    rank: int,
    world: int,
    device,
    backend: str,
    ctrl,
    watchdog,
    observers=(),
    start_report=None,
) -> None:
    """Build this rank's share and run ``train.steps`` timed steps. ``rank`` and ``world`` are
    global (pipeline ranks x ``parallel.data`` replicas). ``observers`` wrap every item (the
    watchdog first). ``start_report()``, called on every rank once the share is built,
    returns rank 0's report (``add_step(step, records)``, ``finish()``, ``close()``), which receives every
    step's per-rank records (replica 0's, the others folded in: `merge_replicas`), and None
    elsewhere."""
    watchdog.phase("building the model", setup=True)
    layout = Layout(schedule.num_ranks, cfg.parallel.data, rank)
    pipe = build_share(cfg, schedule, layout, device, backend, [watchdog, *observers])
    inst = Instruments(cfg, pipe, device)
    pipe.observers.extend(inst.observers)
    watchdog.device_position = getattr(inst.timer, "device_position", None)  # CUDA events: where the GPU is
    opt = make_optimizer(cfg, pipe) if schedule.training else None
    paired = None
    if cfg.run.paired:  # the configs run step by step beside this one (ppx.engine.paired)
        from ppx.engine.paired import PairedSteps

        watchdog.phase("building the paired configs' models", setup=True)
        paired = PairedSteps(cfg, layout, device, backend, watchdog)

    report = start_report() if start_report is not None else None
    records = RecordGatherer(rank, world, cfg.train.steps, max(cfg.runtime.timeout_s, 30.0))
    if backend == "nccl":
        watchdog.phase("NCCL's first collective", setup=True)
        # a first collective on every rank before any partial P2P batch, on the rank's own GPU
        # (named: torch otherwise warns on every rank that it guesses the device)
        dist.barrier(device_ids=[device.index])
    watchdog.phase("aligning clocks")
    offset = offset_to_rank0(ctrl)

    prof = make_profiler(cfg.profile, run_dir, layout.pp_rank, device, layout.dp_rank)  # NO_PROFILER when off
    with prof, StepCollector(cfg.runtime.gc_steps) as collector:
        for step in range(cfg.train.steps):
            beside = paired.run(step, offset, ctrl, prof) if paired is not None and step % 2 else None
            watchdog.phase("step start", step)
            loss, t0, t1 = timed_step(pipe, opt, inst, step, offset, ctrl, prof, device)
            stepped = None
            if opt is not None:
                watchdog.phase("optimizer step", step)
                with prof.label("ppx:optimizer"):
                    stepped = step_optimizer(pipe, opt, device)  # fp16: unscaled, skipped on every rank on an overflow
                    if device.type == "cuda":  # the optimizer's kernels end here, not inside the next step's timing
                        torch.cuda.synchronize(device)
            watchdog.phase("step metrics", step)
            if loss is not None and not math.isfinite(loss):
                raise LossNotFinite(f"the loss is {loss} at step {step} (train.lr={cfg.train.lr:g}); the run stops")
            with prof.label("ppx:step_metrics"):
                record, spans = inst.end_step(step)  # memory peaks include the optimizer step
                record.update(step_facts(cfg, pipe, layout, step, loss, (t0 + offset, t1 + offset), stepped))
                if (
                    spans is not None
                ):  # every step: rank 0 splits waits into transfer and idle; the last go to the timeline
                    record["spans"] = [sp.shifted(offset) for sp in spans]  # Spans on rank 0's clock
            if paired is not None:  # on even steps after the run's own, its peaks and spans taken
                record["paired"] = beside if beside is not None else paired.run(step, offset, ctrl, prof)
            records.put(record)  # gathered to rank 0 by a background thread: no step waits for it
            prof.next_step()
            if report is not None:
                with prof.label("ppx:report"):
                    for s, merged in records.ready():
                        report.add_step(s, merge_replicas(merged))
            with prof.label("ppx:gc"):
                collector.between_steps(step)  # garbage collected here, not inside a timed step
    watchdog.phase("gathering metrics")
    rest = records.rest()
    if report is not None:
        for s, merged in rest:
            report.add_step(s, merge_replicas(merged))
        watchdog.phase("writing the summary and logs")  # (summary.json, TensorBoard, W&B, report.html)
        report.finish()
    watchdog.phase("finishing")
    try:
        dist.barrier(group=ctrl)
    except BaseException:
        if report is not None:  # (a peer gone after the summary: the run failed, its writer stopped soon)
            report.close(completed=False)
        raise
    if report is not None:
        # W&B's writer awaited, the others released: a set-up phase's limit, which its wait keeps within
        watchdog.phase("closing the logs", setup=True)
        report.close()


def make_optimizer(cfg, pipe) -> torch.optim.Optimizer:
    """``train.optimizer`` over this rank's parameters at ``train.lr``: none where its stages
    hold only parameter-free units (an activation, a reshape), as an empty group, so that the
    rank steps (and agrees on fp16's overflow) with the others."""
    opt_cls = torch.optim.SGD if cfg.train.optimizer == "sgd" else torch.optim.AdamW
    return opt_cls([{"params": list(pipe.parameters())}], lr=cfg.train.lr)


def timed_step(pipe, opt, inst, step: int, offset: float, ctrl, prof, device) -> tuple:
    """One pipeline step, timed from the instant every rank starts together (``offset``: this
    rank's clock to rank 0's) to its end on this rank, with the GPU's work done: (its loss,
    None off the last stage; start and end, ``time.perf_counter`` seconds on this rank's
    clock). Its data and zeroed gradients are made before, as a prefetching loader has them."""
    with prof.label("ppx:prepare"):
        batch = pipe.microbatches(step)
        if opt is not None:
            opt.zero_grad(set_to_none=True)
    inst.begin_step(step)  # peaks reset (a page-table walk on CPU) before the common start, not after it
    with prof.label("ppx:align_start"):
        start_together(offset, ctrl)
    with prof.step(step):  # ProfilerStep#<step>: the timed pipeline step and nothing else
        t0 = time.perf_counter()
        loss = pipe.step(step, batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
    return loss, t0, t1


def step_facts(cfg, pipe, layout: Layout, step: int, loss, span: tuple[float, float], stepped) -> dict:
    """What a step's record says besides the instruments': the pipeline rank, the loss, the
    step's start and end (seconds on rank 0's clock), the replica, how each split stage ran its
    W (first step), whether fp16's optimizer stepped (``stepped``)."""
    out = {"rank": layout.pp_rank, "loss": loss, "start": span[0], "end": span[1]}
    if layout.data > 1:
        out["replica"] = layout.dp_rank
    if step == 0 and pipe.split_backward:
        out["split_backward"] = {str(s): v for s, v in pipe.split_backward.items() if v}
    if stepped is not None and cfg.train.dtype == "fp16":
        out["optimizer_stepped"] = stepped
    return out
