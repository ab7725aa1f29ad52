"""One benchmark case, run under torchrun (one process per stage, gloo on CPU).

Measures, side by side in one process group and alternating step by step, the variants a
case names: ``ppx`` (timers off), ``ppx_timers``, ``ppx_all`` (timers + memory counters as
`ppx run` has them: saved bytes counted in the first ``instrument.memory_steps`` steps),
``ppx_all_steps`` (the counters counting every step: ``instrument.memory_steps=0``), and
``torch`` (torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B on the very same
stage modules and data, made before the step as a prefetching loader has it), in processes
pinned as `ppx run` pins them. A ppx variant may name another schedule after an ``@``
(``ppx_all@zb_h1``), and overrides of its own after a ``+`` each
(``ppx@zb_h1+train.split_backward=drain``): it runs that schedule on a pipeline of its own,
built from the same config and seed, so two schedules are compared step by step on the same
machine state.
Each step starts on every rank at the same instant; its time is the last rank's end minus
the first rank's start. Rank 0 writes the medians, and every measured step, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import torch
import torch.distributed as dist

from ppx import config, models
from ppx.config import resolve_schedule
from ppx.engine.comm import P2P
from ppx.engine.garbage import StepCollector
from ppx.engine.rank import build_rank, build_stage_modules
from ppx.launch.affinity import pin_local_rank
from ppx.measure.clock import offset_to_rank0, start_together
from ppx.measure.instruments import Instruments
from ppx.measure.prediction import transport_of
from ppx.measure.theory import known_cost_timeline
from ppx.models.action_clock import ActionClock
from ppx.schedules import registry


def torch_variant(cfg, schedule, rank, world):
    """torch.distributed.pipelining on the same stage module and data as ppx."""
    import torch.distributed.pipelining as pipelining
    from torch.distributed.pipelining import PipelineStage

    kind = models.kind(cfg.model.kind)
    clock = ActionClock()  # what ppx's executors own; the known-cost model charges to it
    module = build_stage_modules(cfg, world, [rank], "cpu", clock)[rank]
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    # bracket every action with the clock, as ppx's executors do (the known-cost model charges to it)
    for name in ("forward_one_chunk", "backward_one_chunk"):
        original = getattr(stage, name)

        def announced(*a, _original=original, **k):
            with clock.action():
                return _original(*a, **k)

        setattr(stage, name, announced)
    cls = getattr(pipelining, registry.TORCH_CLASSES[f"torch_{cfg.pipeline.schedule}"])
    sched = cls(stage, n_microbatches=schedule.num_microbatches, loss_fn=kind.loss)
    params = list(module.parameters())

    def prepare(i):
        return kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, i)

    def step(batch):
        for q in params:
            q.grad = None
        x, y = batch
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()

    return prepare, step


_shared: dict = {}


def ppx_variant(cfg, schedule, rank, observers_of, count_steps=None):
    """The ppx variants of one schedule share one pipeline and differ only in the observers
    switched on (``count_steps``: the memory counters' ``instrument.memory_steps``, None: the
    config's)."""
    if schedule.name not in _shared:
        pipe = build_rank(cfg, schedule, rank, "cpu", P2P.for_backend("gloo"))
        _shared[schedule.name] = pipe, Instruments(cfg, pipe, torch.device("cpu"))
    pipe, inst = _shared[schedule.name]
    observers = observers_of(inst)
    params = pipe.parameters()

    def step(i_batch):
        i, batch = i_batch
        for q in params:
            q.grad = None
        pipe.runtime.observers = observers
        if inst.memory is not None:
            inst.memory.count_steps = cfg.instrument.memory_steps if count_steps is None else count_steps
        inst.begin_step(i)
        pipe.step(i, batch)
        inst.end_step(i)

    return (lambda i: (i, pipe.microbatches(i))), step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", default=None, help="an experiment the overrides apply to (default: none)")
    ap.add_argument("--overrides", nargs="*", default=[])
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    # pinned as `ppx run` pins CPU ranks (runtime.pin_cpus), for ppx and torch variants alike
    pin_local_rank(int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = config.load(args.experiment, args.overrides + [f"pipeline.stages={world}"])
    schedule = resolve_schedule(cfg)
    observed = {
        "ppx": lambda inst: [],
        "ppx_timers": lambda inst: [inst.timer],
        "ppx_all": lambda inst: inst.observers,
        "ppx_all_steps": lambda inst: inst.observers,
    }

    def make(variant: str):
        if variant == "torch":
            return torch_variant(cfg, schedule, rank, world)
        kind, _, other = variant.partition("@")
        count = 0 if kind == "ppx_all_steps" else None
        if not other:
            return ppx_variant(cfg, schedule, rank, observed[kind], count)
        # ppx@zb_h1+train.split_backward=drain: overrides of its own, each a "+" before a key=
        name, *extra = re.split(r"\+(?=[A-Za-z_][\w.]*=)", other)
        c = config.load(
            args.experiment, [*args.overrides, f"pipeline.stages={world}", f"pipeline.schedule={name}", *extra]
        )
        return ppx_variant(c, resolve_schedule(c), rank, observed[kind], count)

    steps = {v: make(v) for v in args.variants}
    offset = offset_to_rank0()
    times = {v: [] for v in args.variants}
    # Python's collector kept out of the timed steps, as ppx run's loop keeps it
    # (runtime.gc_steps): left automatic, the Python objects the memory counters' hooks make
    # start collections inside the steps of the variants that count
    with StepCollector(cfg.runtime.gc_steps) as collector:
        for rep in range(args.warmup + args.reps):
            order = args.variants if rep % 2 == 0 else args.variants[::-1]
            for v in order:
                prepare, run = steps[v]
                batch = prepare(rep)  # data is ready before the step, as in ppx's training loop
                start_together(offset)
                t0 = time.perf_counter()
                run(batch)
                t1 = time.perf_counter()
                windows = [None] * world if rank == 0 else None  # every rank's (start, end) of the step
                dist.gather_object((t0 + offset, t1 + offset), windows, dst=0)
                if rank == 0 and rep >= args.warmup:
                    times[v].append(max(e for _, e in windows) - min(s for s, _ in windows))
                collector.between_steps(rep)
    if rank == 0:
        ideal = known_cost_timeline(cfg, schedule, transport_of(cfg, "gloo"))  # None for the MLP
        result = {
            "overrides": args.overrides,
            "world_size": world,
            "reps": args.reps,
            "median_step_s": {v: statistics.median(t) for v, t in times.items()},
            "steps_s": times,  # every measured step, in order: pairs of variants ran side by side
            "ideal_step_s": ideal.makespan if ideal is not None else None,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    dist.barrier()
    # torch's schedules may leave their last sends unwaited; tearing the group down under
    # them aborts the process, so leave without the teardown (results are written).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
