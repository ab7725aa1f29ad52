"""The training loop of one rank: timed steps, per-step metrics gathered on rank 0, and the
run directory's metrics, summary and timeline."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ppx import rundir
from ppx.comm import P2P
from ppx.faults import FaultInjector, parse_fault
from ppx.instrument import Instruments
from ppx.instrument.clock import offset_to_rank0, start_together
from ppx.instrument.profiler import make_profiler
from ppx.pipeline import build_rank
from ppx.report.run_report import RunReport
from ppx.schedules.schedule import Schedule


def train(cfg, schedule: Schedule, run_dir: Path, rank: int, world: int, device, backend: str, ctrl, watchdog) -> None:
    observers = [watchdog]
    fault = cfg.runtime.inject_fault
    if fault and schedule.stage_to_rank[parse_fault(fault)[1].stage] == rank:
        observers.append(FaultInjector(fault))
    watchdog.phase("building the model")
    if cfg.pipeline.schedule.startswith("torch_") or cfg.pipeline.executor == "torch":
        from ppx.torch_backend import TorchPipeline

        pipe = TorchPipeline(cfg, schedule, rank, device, observers)
    else:
        pipe = build_rank(cfg, schedule, rank, device, P2P.for_backend(backend), observers)
    inst = Instruments(cfg, pipe.runtime, device)
    pipe.runtime.observers.extend(inst.observers)
    watchdog.device_position = getattr(inst.timer, "device_position", None)  # CUDA events: where the GPU is
    opt = None
    if schedule.training:
        opt_cls = torch.optim.SGD if cfg.train.optimizer == "sgd" else torch.optim.AdamW
        opt = opt_cls(pipe.parameters(), lr=cfg.train.lr)

    watchdog.phase("gathering the environment")
    infos = [None] * world if rank == 0 else None
    dist.gather_object(rundir.rank_info(device), infos, dst=0, group=ctrl)
    if rank == 0:
        rundir.write_json(run_dir / "env.json", rundir.environment(cfg, backend, world, infos))
    if backend == "nccl":
        dist.barrier()  # a first collective on every rank before any partial P2P batch
    watchdog.phase("aligning clocks")
    offset = offset_to_rank0(ctrl)

    steps = cfg.train.steps
    profiler = make_profiler(cfg.profile, run_dir, rank, device) if cfg.profile.enabled else contextlib.nullcontext()
    report = RunReport(cfg, schedule, run_dir, world, backend, device.type) if rank == 0 else None
    with profiler:
        for step in range(steps):
            watchdog.phase("step start", step)
            batch = pipe.microbatches(step)  # data is ready before the step, as a prefetching loader has it
            start_together(offset, ctrl)
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            inst.begin_step(step)
            t0 = time.perf_counter()
            loss = pipe.step(step, batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            if opt is not None:
                watchdog.phase("optimizer step", step)
                opt.step()
            if device.type == "cuda":  # the optimizer's kernels end here, not inside the next step's timing
                torch.cuda.synchronize(device)
            record, spans = inst.end_step(step)  # memory peaks include the optimizer step
            if cfg.profile.enabled:
                profiler.step()
            watchdog.phase("gathering metrics", step)
            record.update(rank=rank, loss=loss, start=t0 + offset, end=t1 + offset)
            if spans is not None:  # every step: rank 0 splits waits into transfer and idle; the last go to the timeline
                record["spans"] = [(it.kind, it.label, [str(a) for a in it.actions], s + offset, e + offset) for it, s, e in spans]
            records = [None] * world if rank == 0 else None
            dist.gather_object(record, records, dst=0, group=ctrl)
            if report is not None:
                report.add_step(step, records)
    if report is not None:
        watchdog.phase("writing the report")
        report.finish()
    watchdog.phase("finishing")
    dist.barrier(group=ctrl)
