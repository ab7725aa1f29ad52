"""One pipeline rank from start to finish: process group, model share, training loop and,
on rank 0, the run directory's files. ``python -m ppx.launch.worker RUN_DIR`` is what the launcher
starts under torchrun."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ppx import config as config_mod
from ppx.config import Config, resolve_schedule
from ppx.config.fault_spec import parse_fault
from ppx.engine.loop import train
from ppx.engine.runtime import ActionFailed
from ppx.errors import UserError, said_where
from ppx.files import write_json
from ppx.launch import claim, environment
from ppx.launch.affinity import pin_local_rank, pin_order
from ppx.launch.closed_stdout import survive_closed_output
from ppx.launch.crash_stacks import stacks_to_file
from ppx.launch.failure_line import kept_traceback, report_failure
from ppx.launch.faults import FaultInjector
from ppx.launch.heartbeat import Heartbeat
from ppx.launch.stop_signal import await_stop, follow_stop_signal
from ppx.launch.thread_errors import one_line_thread_errors
from ppx.launch.watchdog import SETUP_FLOOR_S, Watchdog
from ppx.report.run_report import RunReport


def _init_process_group(backend: str, timeout_s: float) -> None:
    timeout = timedelta(seconds=max(timeout_s, SETUP_FLOOR_S))  # the first collectives are set-up
    if int(os.environ["WORLD_SIZE"]) == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)


def _shared_run_dir(cfg: Config, run_dir: Path | None, group) -> Path:
    """Rank 0 claims the run directory (when the launcher has not) and tells the others."""
    if run_dir is not None:
        return run_dir
    box = [None]
    if dist.get_rank() == 0:
        try:
            path = claim.claim(cfg)
            claim.write_config(path, cfg)
            box = [str(path)]
        except UserError as e:
            box = ["error:" + str(e)]
        except OSError as e:  # an unwritable run.root: every rank ends with this one line
            box = [f"error:cannot create the run directory: {e.strerror or e}: {e.filename or cfg.run.root}"]
    dist.broadcast_object_list(box, src=0, group=group)
    if box[0].startswith("error:"):
        raise UserError(box[0][len("error:") :])
    return Path(box[0])


def _early_heartbeat(run_dir: Path | None, rank: int) -> Heartbeat | None:
    """The rank's heartbeat from before its process group is up, where the run directory is
    known (under ``ppx run``): a rank frozen while the ranks meet is named by the launcher
    after ``runtime.timeout_s``, where its peers' rendezvous would take minutes to give up. A
    rank waiting there on a slower peer keeps beating (the waits release the GIL)."""
    if run_dir is None:
        return None
    status = run_dir / "status"
    try:
        status.mkdir(parents=True, exist_ok=True)
    except OSError:  # (the watchdog's own attempt says it in the rank's one line)
        return None
    return Heartbeat(status, rank).start()


def run_rank(cfg: Config, run_dir: Path | None, device_type: str) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    survive_closed_output()  # (ppx run ... | head: the run goes on)
    thread_hook = one_line_thread_errors(rank)
    job_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None  # (before pinning)
    if device_type != "cuda" and cfg.runtime.pin_cpus:  # before any thread starts, so all inherit it
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        pin_local_rank(pin_order(rank, world, local_rank, local_world, cfg.parallel.data), local_world)
    torch.set_num_threads(cfg.runtime.threads_per_rank)
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    beat = _early_heartbeat(run_dir, rank)  # (after the device's set-up, which may hold the GIL)
    _init_process_group(backend, cfg.runtime.timeout_s)
    ctrl = dist.new_group(backend="gloo") if backend == "nccl" else None  # metrics, off the GPU
    watchdog = None
    try:
        run_dir = _shared_run_dir(cfg, run_dir, ctrl)
        watchdog = Watchdog(rank, cfg.runtime.timeout_s, run_dir / "status", heartbeat=beat).start()
        stacks_to_file(run_dir / "status", rank)
        if world > 1:
            follow_stop_signal(watchdog)  # a peer killed under a torchrun of the user's is named
        code = _train(cfg, run_dir, rank, world, device, backend, ctrl, watchdog, job_cpus)
        watchdog.phase("done")
        return code
    except (ActionFailed, UserError) as e:
        own = not isinstance(e, ActionFailed)  # (a mistake of the input's: its one line says it all)
        message = str(e) + ("" if own else kept_traceback(watchdog, e.__cause__ or e))
        report_failure(watchdog, message, own=own, peer=getattr(e, "peer", None))
        await_stop()
        return 2 if isinstance(e, UserError) and not isinstance(e, ActionFailed) else 1
    except Exception as e:
        if os.environ.get("PPX_TRACEBACK"):  # for ppx's developers: the whole story, not one line
            traceback.print_exc()
        where = watchdog.where() if watchdog else "start-up"
        report_failure(watchdog, f"rank {rank} failed on {where}: {said_where(e)}" + kept_traceback(watchdog, e))
        await_stop()
        return 1
    finally:
        if watchdog is not None:
            watchdog.stop()
        if dist.is_initialized():
            dist.destroy_process_group()
        threading.excepthook = thread_hook


def _train(
    cfg: Config, run_dir: Path, rank: int, world: int, device, backend: str, ctrl, watchdog: Watchdog, cpus
) -> int:
    """``cpus``: the job's CPUs, before this rank was pinned to its own (for the report's W&B writer)."""
    schedule = resolve_schedule(cfg)
    d = cfg.parallel.data
    if schedule.num_ranks * d != world:
        raise UserError(f"the schedule needs {schedule.num_ranks * d} processes, this job has {world}")
    observers = []
    fault = cfg.runtime.inject_fault
    if fault and schedule.stage_to_rank[parse_fault(fault)[1].stage] * d == rank:  # in replica 0
        observers.append(FaultInjector(fault))

    def start_report() -> RunReport | None:
        """Once the share is built (a failed build leaves no report behind): every rank's
        environment to env.json, and rank 0's report. Collective: every rank calls it."""
        watchdog.phase("gathering the environment", setup=True)  # the first wait on the other ranks' builds
        infos = [None] * world if rank == 0 else None
        info = {"rank": rank, "pipeline_rank": rank // d, "replica": rank % d, **environment.rank_info(device)}
        dist.gather_object(info, infos, dst=0, group=ctrl)
        if rank != 0:
            return None
        write_json(run_dir / "env.json", environment.environment(cfg, backend, world, infos))
        return RunReport(cfg, schedule, run_dir, schedule.num_ranks, backend, device.type, cpus)

    train(cfg, schedule, run_dir, rank, world, device, backend, ctrl, watchdog, observers, start_report)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    cfg = config_mod.from_yaml(run_dir / "config.yaml")
    return run_rank(cfg, run_dir, os.environ.get("PPX_DEVICE", "cpu"))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and the process groups are destroyed: skip interpreter finalization,
    # where gloo's C++ threads releasing tensors have been seen to abort a finished rank
    # ("terminate called without an active exception", once in ~25 runs here).
    os._exit(code)
