"""One pipeline rank from start to finish: process group, model share, training loop and,
on rank 0, the run directory's files. ``python -m ppx.worker RUN_DIR`` is what the launcher
starts under torchrun."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ppx import config as config_mod
from ppx import rundir, schedules
from ppx.comm import P2P
from ppx.config import Config
from ppx.errors import UserError
from ppx.faults import FaultInjector, parse_fault
from ppx.pipeline import build_rank, resolve_schedule
from ppx.runtime import ActionFailed
from ppx.watchdog import Watchdog


def _init_process_group(backend: str, timeout_s: float) -> None:
    timeout = timedelta(seconds=max(timeout_s, 30.0))
    if int(os.environ["WORLD_SIZE"]) == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)


def _shared_run_dir(cfg: Config, run_dir: Optional[Path], group) -> Path:
    """Rank 0 claims the run directory (when the launcher has not) and tells the others."""
    if run_dir is not None:
        return run_dir
    box = [None]
    if dist.get_rank() == 0:
        try:
            path = rundir.claim(cfg)
            (path / "config.yaml").write_text(config_mod.to_yaml(cfg))
            box = [str(path)]
        except UserError as e:
            box = ["error:" + str(e)]
    dist.broadcast_object_list(box, src=0, group=group)
    if box[0].startswith("error:"):
        raise UserError(box[0][len("error:"):])
    return Path(box[0])


def run_rank(cfg: Config, run_dir: Optional[Path], device_type: str) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(cfg.runtime.threads_per_rank)
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    _init_process_group(backend, cfg.runtime.timeout_s)
    ctrl = dist.new_group(backend="gloo") if backend == "nccl" else None  # metrics, off the GPU
    watchdog = None
    try:
        run_dir = _shared_run_dir(cfg, run_dir, ctrl)
        watchdog = Watchdog(rank, cfg.runtime.timeout_s, run_dir / "status").start()
        code = _train(cfg, run_dir, rank, world, device, backend, ctrl, watchdog)
        watchdog.phase("done")
        return code
    except (ActionFailed, UserError) as e:
        _report(watchdog, str(e))
        return 2 if isinstance(e, UserError) and not isinstance(e, ActionFailed) else 1
    except Exception as e:
        where = watchdog.where() if watchdog else "start-up"
        _report(watchdog, f"rank {rank} failed on {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    finally:
        if watchdog is not None:
            watchdog.stop()
        if dist.is_initialized():
            dist.destroy_process_group()


def _report(watchdog: Optional[Watchdog], message: str) -> None:
    sys.stderr.write(f"ppx: error: {message}\n")
    sys.stderr.flush()
    if watchdog is not None:
        watchdog.phase(f"failed on {watchdog.label}")


def _train(cfg: Config, run_dir: Path, rank: int, world: int, device, backend: str, ctrl, watchdog: Watchdog) -> int:
    schedule = resolve_schedule(cfg)
    if schedule.num_ranks != world:
        raise UserError(f"the schedule needs {schedule.num_ranks} processes, this job has {world}")
    observers = [watchdog]
    fault = cfg.runtime.inject_fault
    if fault and schedule.stage_to_rank[parse_fault(fault)[1].stage] == rank:
        observers.append(FaultInjector(fault))
    watchdog.phase("building the model")
    pipe = build_rank(cfg, schedule, rank, device, P2P(), observers)
    params = pipe.parameters()
    opt = None
    if schedule.training:
        opt_cls = torch.optim.SGD if cfg.train.optimizer == "sgd" else torch.optim.AdamW
        opt = opt_cls(params, lr=cfg.train.lr)

    watchdog.phase("gathering the environment")
    infos = [None] * world if rank == 0 else None
    dist.gather_object(rundir.rank_info(device), infos, dst=0, group=ctrl)
    if rank == 0:
        rundir.write_json(run_dir / "env.json", rundir.environment(cfg, backend, world, infos))
    if backend == "nccl":
        dist.barrier()  # a first collective on every rank before any partial P2P batch

    name = cfg.run.name
    losses, times = [], []
    metrics = open(run_dir / "metrics.jsonl", "a") if rank == 0 else None
    try:
        for step in range(cfg.train.steps):
            watchdog.phase("step barrier", step)
            dist.barrier(group=ctrl)
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss = pipe.step(step)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
            if opt is not None:
                watchdog.phase("optimizer step", step)
                opt.step()
            watchdog.phase("gathering metrics", step)
            records = [None] * world if rank == 0 else None
            dist.gather_object({"rank": rank, "loss": loss, "step_time_s": elapsed}, records, dst=0, group=ctrl)
            if rank == 0:
                step_loss = next(r["loss"] for r in records if r["loss"] is not None)
                step_time = max(r["step_time_s"] for r in records)
                losses.append(step_loss)
                times.append(step_time)
                metrics.write(json.dumps({"step": step, "loss": step_loss, "step_time_s": step_time}) + "\n")
                metrics.flush()
                print(f"[{name}] step {step + 1}/{cfg.train.steps}  loss {step_loss:.6f}  step {step_time:.4f} s", flush=True)
    finally:
        if metrics is not None:
            metrics.close()
    if rank == 0:
        p, m = schedule.num_ranks, schedule.num_microbatches
        summary = {
            "status": "completed",
            "experiment": name,
            "schedule": cfg.pipeline.schedule,
            "stages": schedule.num_stages,
            "microbatches": m,
            "world_size": world,
            "steps": cfg.train.steps,
            "device": device.type,
            "backend": backend,
            "losses": losses,
            "step_time_s": statistics.median(times),
            "step_times_s": times,
            "bubble_fraction_theory": schedules.theory_bubble(cfg.pipeline.schedule, p, m),
        }
        rundir.write_json(run_dir / "summary.json", summary)
        print(f"ppx: run directory: {run_dir}", flush=True)
    watchdog.phase("finishing")
    dist.barrier(group=ctrl)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    cfg = config_mod.from_yaml(run_dir / "config.yaml")
    return run_rank(cfg, run_dir, os.environ.get("PPX_DEVICE", "cpu"))


if __name__ == "__main__":
    sys.exit(main())
