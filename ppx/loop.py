"""The training loop of one rank: timed steps, per-step metrics gathered on rank 0, and the
run directory's metrics, summary and timeline."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ppx import rundir, schedules
from ppx.comm import P2P
from ppx.faults import FaultInjector, parse_fault
from ppx.instrument import Instruments
from ppx.instrument.clock import offset_to_rank0, start_together
from ppx.instrument.profiler import make_profiler
from ppx.metrics import over_ideal, run_summary, step_breakdown
from ppx.pipeline import build_rank
from ppx.schedules.schedule import Schedule


def ideal_step_time_s(cfg, schedule: Schedule):
    """The exact ideal step time of the known-cost model (simulated, zero communication)."""
    if cfg.model.kind != "synthetic":
        return None
    from ppx.models.synthetic import stage_costs_ms

    fwd, bwd = stage_costs_ms(cfg.model, schedule.num_stages)
    costs = schedules.Costs(fwd=[f / 1e3 for f in fwd], bwd=[b / 1e3 for b in bwd])
    return schedules.simulate(schedule, costs).makespan


def train(cfg, schedule: Schedule, run_dir: Path, rank: int, world: int, device, backend: str, ctrl, watchdog) -> None:
    observers = [watchdog]
    fault = cfg.runtime.inject_fault
    if fault and schedule.stage_to_rank[parse_fault(fault)[1].stage] == rank:
        observers.append(FaultInjector(fault))
    watchdog.phase("building the model")
    pipe = build_rank(cfg, schedule, rank, device, P2P.for_backend(backend), observers)
    inst = Instruments(cfg, pipe.runtime, device)
    pipe.runtime.observers.extend(inst.observers)
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
    window = range(max(0, steps - cfg.instrument.timeline_steps), steps) if cfg.instrument.timeline else range(0)
    profiler = make_profiler(cfg.profile, run_dir, rank, device) if cfg.profile.enabled else contextlib.nullcontext()
    report = _Rank0Report(cfg, schedule, run_dir, world) if rank == 0 else None
    with profiler:
        for step in range(steps):
            watchdog.phase("step start", step)
            start_together(offset, ctrl)
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            inst.begin_step(step)
            t0 = time.perf_counter()
            loss = pipe.step(step)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            record, spans = inst.end_step(step)
            if opt is not None:
                watchdog.phase("optimizer step", step)
                opt.step()
            if cfg.profile.enabled:
                profiler.step()
            watchdog.phase("gathering metrics", step)
            record.update(rank=rank, loss=loss, start=t0 + offset, end=t1 + offset)
            if step in window and spans is not None:
                record["spans"] = [(it.kind, it.label, [str(a) for a in it.actions], s + offset, e + offset) for it, s, e in spans]
            records = [None] * world if rank == 0 else None
            dist.gather_object(record, records, dst=0, group=ctrl)
            if report is not None:
                report.add_step(step, records)
    if report is not None:
        watchdog.phase("writing the report")
        report.finish(ideal_step_time_s(cfg, schedule))
    watchdog.phase("finishing")
    dist.barrier(group=ctrl)


class _Rank0Report:
    """Rank 0's side: metrics.jsonl as steps come in, then summary.json and the timeline."""

    def __init__(self, cfg, schedule: Schedule, run_dir: Path, world: int):
        self.cfg, self.schedule, self.run_dir, self.world = cfg, schedule, run_dir, world
        p, m = schedule.num_ranks, schedule.num_microbatches
        self.theory = schedules.theory_bubble(cfg.pipeline.schedule, p, m)
        self.steps: list[dict] = []
        self.losses: list[float] = []
        self.timeline: list[dict] = []
        self.metrics = open(run_dir / "metrics.jsonl", "a")

    def add_step(self, step: int, records: list[dict]) -> None:
        loss = next((r["loss"] for r in records if r["loss"] is not None), None)
        m = step_breakdown(records)
        line = {"step": step, "loss": loss, **m, "bubble_fraction_theory": self.theory}
        self.metrics.write(json.dumps(line) + "\n")
        self.metrics.flush()
        self.steps.append(m)
        self.losses.append(loss)
        if any("spans" in r for r in records):
            self.timeline.append({"step": step, "ranks": {r["rank"]: r["spans"] for r in records if "spans" in r}})
        msg = f"[{self.cfg.run.name}] step {step + 1}/{self.cfg.train.steps}  loss {loss:.6f}  step {m['step_time_s']:.4f} s"
        if "bubble_fraction" in m:
            msg += f"  bubble {m['bubble_fraction']:.1%}"
            if self.theory is not None:
                msg += f" (theory {self.theory:.1%})"
        print(msg, flush=True)

    def finish(self, ideal_s) -> None:
        self.metrics.close()
        cfg, sched = self.cfg, self.schedule
        summary = {
            "status": "completed",
            "experiment": cfg.run.name,
            "schedule": cfg.pipeline.schedule,
            "stages": sched.num_stages,
            "microbatches": sched.num_microbatches,
            "world_size": self.world,
            "steps": cfg.train.steps,
            "model": cfg.model.kind,
            "losses": self.losses,
            "step_times_s": [s["step_time_s"] for s in self.steps],
            **run_summary(self.steps),
            "bubble_fraction_theory": self.theory,
            "bubble_over_ideal_theory": over_ideal(self.theory),
            "ideal_step_time_s": ideal_s,
            "bubble_normalisation": "bubble_fraction = idle / step time; bubble_over_ideal = idle / busy time",
        }
        if ideal_s:
            summary["step_time_over_ideal"] = summary["step_time_s"] / ideal_s
        rundir.write_json(self.run_dir / "summary.json", summary)
        if self.timeline:
            from ppx.report.gantt import draw_step
            from ppx.report.timeline import chrome_trace

            title = f"{cfg.run.name}: {cfg.pipeline.schedule}, p={sched.num_ranks}, m={sched.num_microbatches}"
            trace = chrome_trace(self.timeline, sched.stage_to_rank, title)
            (self.run_dir / "timeline.json").write_text(json.dumps(trace))
            last = self.timeline[-1]
            m = self.steps[last["step"]]
            sub = f"{title}, step {last['step']}: {m['step_time_s'] * 1e3:.1f} ms"
            if "bubble_fraction" in m:
                sub += f", bubble {m['bubble_fraction']:.1%} measured"
                if self.theory is not None:
                    sub += f" vs {self.theory:.1%} theory (idle / step time)"
            draw_step(last["ranks"], self.run_dir / "timeline.png", sub)
        print(f"ppx: run directory: {self.run_dir}", flush=True)
