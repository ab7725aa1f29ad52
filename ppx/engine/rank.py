"""Assemble one rank's share of an experiment: the schedule, its stage modules, the runtime
and the microbatches it feeds."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from ppx import models
from ppx.config import Config, resolve_schedule
from ppx.engine.data_parallel import DataParallel
from ppx.engine.linears import StepWeights
from ppx.engine.precision import Precision
from ppx.engine.recompute import Recompute
from ppx.engine.runtime import Runtime
from ppx.engine.split_setup import SampleMicrobatch, set_up_split, settle_input_copies
from ppx.engine.stage import StageRunner
from ppx.engine.step_batch import StepBatches
from ppx.engine.tied import TiedGrads
from ppx.models.action_clock import ActionClock
from ppx.models.costs import recompute_modes
from ppx.models.precision_ops import tracing
from ppx.models.seeding import seed_unit
from ppx.schedules.ir.action import Op
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.ir.structure import whole_backward_stages


def build_stage_modules(
    cfg: Config, num_stages: int, stages: Sequence[int], device, clock: ActionClock | None = None
) -> dict[int, nn.Module]:
    """The modules of ``stages`` (block ranges from the split), on ``device``; ``clock`` is
    the executor's, for models whose cost is set."""
    kind = models.kind(cfg.model.kind)
    ranges = models.split_of(cfg, num_stages)  # llama: its embedding and head are units
    if cfg.pipeline.split == "tracer":
        return traced_stage_modules(cfg, ranges, stages, device)
    if hasattr(kind, "calibrate"):  # a model that measures the device once, before any timed step
        kind.calibrate(torch.device(device))
    return {s: kind.build_stage(cfg.model, cfg.train.seed, s, num_stages, ranges[s], clock).to(device) for s in stages}


def traced_stage_modules(cfg: Config, ranges: Sequence[range], stages: Sequence[int], device) -> dict[int, nn.Module]:
    """torch.distributed.pipelining's tracer split: the whole model, traced on one microbatch
    and cut before the first block of every stage but the first (same blocks per stage as
    the layer split, same parameters, now as one GraphModule per stage). A stage's dropout
    masks are keyed by its first unit (`ppx.models.seeding.seed_unit`): the same on every
    schedule and recomputation, not on another stage count."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    kind = models.kind(cfg.model.kind)
    whole = build_reference(cfg)
    x, _ = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    example = x[: cfg.microbatch_size()]
    spec = {kind.block_name(cfg.model, r.start): SplitPoint.BEGINNING for r in ranges[1:]}
    mixed = Precision(cfg.train.dtype, "cpu").mixed  # (fp32: no cast to leave in the graph)
    with warnings.catch_warnings(), tracing(mixed):  # (torch's own deprecation notices from inside the tracer)
        warnings.simplefilter("ignore", FutureWarning)
        pipe = pipeline(whole, mb_args=(example,), split_spec=spec)
    if pipe.num_stages != len(ranges):
        raise RuntimeError(f"the tracer made {pipe.num_stages} stages, expected {len(ranges)}")
    out = {s: pipe.get_stage_module(s).to(device) for s in stages}
    for s, module in out.items():  # the traced graph calls no seed_unit: the stage's first unit keys its masks
        module.register_forward_pre_hook(lambda _m, _a, first=ranges[s].start: seed_unit(first))
    return out


def build_reference(cfg: Config, device="cpu") -> nn.Module:
    """The whole model as one module, as a single process would train it."""
    kind = models.kind(cfg.model.kind)
    units = range(models.unit_count(cfg.model))
    return kind.build_stage(cfg.model, cfg.train.seed, 0, 1, units).to(device)


class StageShare:
    """What a rank's share of the pipeline answers, whichever executor runs it: ``modules``
    maps its stage indices to modules, ``schedule`` is the schedule, ``observers`` wrap every
    item the executor runs, and `in_flight` counts the microbatches held for a backward. The
    rest has a default for an executor without it: ``precision`` (fp16's loss scaling for the
    optimizer step), ``split_backward`` (for summary.json), `held_by_store`, `held_with_graph`, `weight_copies`
    and `whole_stages` (for the memory counters)."""

    modules: dict
    schedule: Schedule
    observers: list
    precision = None  # `ppx.engine.precision.Precision`; None: the optimizer steps plainly
    split_backward = None  # stage -> how its split backward gets its weight gradients; None: no split

    def in_flight(self) -> int:
        raise NotImplementedError

    def held_by_store(self, stage: int, mb: int) -> list | None:
        """What ``stage`` holds of ``mb`` for its W outside autograd's saved tensors (None: nothing)."""
        return None

    def held_with_graph(self, stage: int, mb: int) -> list:
        """What a stage that keeps its graph from its I to its W holds of ``mb`` beside it."""
        return []

    def weight_copies(self) -> list[set]:
        """The storage pointers of the stages' compute-dtype weight copies (none: no copies)."""
        return []

    def whole_stages(self) -> frozenset:
        """The stages whose I runs the whole backward and whose W nothing (none: no such stage)."""
        return frozenset()

    @property
    def owns_first(self) -> bool:
        return 0 in self.modules

    @property
    def owns_last(self) -> bool:
        return self.schedule.num_stages - 1 in self.modules

    def parameters(self) -> list[nn.Parameter]:
        return [p for s in sorted(self.modules) for p in self.modules[s].parameters()]


@dataclass
class RankPipeline(StageShare):
    """Everything rank ``rank`` needs to run steps."""

    cfg: Config
    schedule: Schedule
    rank: int
    device: torch.device
    kind: ModuleType
    modules: dict[int, nn.Module]
    runtime: Runtime
    data_parallel: DataParallel | None = None  # parallel.data > 1: this replica's place and the reduction
    precision: Precision | None = None  # train.dtype: autocast, boundary dtype, fp16 loss scaling
    split_backward: dict | None = None  # stage -> how its split backward gets its weight gradients
    tied: TiedGrads | None = None  # weights tied across stages: their gradients summed each step

    @functools.cached_property
    def batches(self) -> StepBatches:
        """Each step's whole batch, checked against the first step's."""
        return StepBatches(self.cfg, self.kind, self.runtime.names[self.rank])

    @property
    def observers(self) -> list:
        return self.runtime.observers

    def in_flight(self) -> int:
        return self.runtime.in_flight()

    def held_by_store(self, stage: int, mb: int) -> list | None:
        """What a storing ``stage`` holds of ``mb`` outside its graph: the stored layers' inputs
        from its forward on, their output gradients too from its I (None: not storing)."""
        store = self.runtime.stages[stage].store
        return None if store is None else store.held(mb)

    def held_with_graph(self, stage: int, mb: int) -> list:
        """What a stage that keeps its graph from its I to its W holds of ``mb`` beside it: the
        output gradient its W takes again (none on the last stage, whose I starts from the loss)."""
        g = self.runtime.stages[stage].grad_outputs.get(mb)
        return [] if g is None else [g]

    def weight_copies(self) -> list[set]:
        """The storage pointers of each stage's weight copies (sets updated in place)."""
        return [r.weights.storages for r in self.runtime.stages.values() if r.weights is not None]

    def whole_stages(self) -> frozenset:
        """The stages whose every I is followed at once by its W: the I runs the whole backward."""
        return frozenset(s for s, r in self.runtime.stages.items() if r.whole_in_input)

    def microbatches(self, step: int) -> tuple[list | None, list | None]:
        """This step's inputs (if this rank owns the first stage) and targets (if the last),
        split into microbatches, on this rank's device. Each microbatch is its own tensor
        (as a loader gives it, and as ``.to(cuda)`` makes it): a view into the whole batch
        would keep the whole batch alive, and counted, for every microbatch saved for backward."""
        if not (self.owns_first or self.owns_last):
            return None, None
        x, y = self.batches(step)
        if self.data_parallel is not None:  # this replica's share of the global batch
            x, y = self.data_parallel.layout.share(x), self.data_parallel.layout.share(y)
        m = self.schedule.num_microbatches
        xs = [c.to(self.device, copy=True) for c in x.chunk(m)] if self.owns_first else None
        ys = [c.to(self.device, copy=True) for c in y.chunk(m)] if self.owns_last else None
        return xs, ys

    def step(self, step: int, batch: tuple | None = None) -> float | None:
        """One pipelined step; ``batch`` = this step's ``microbatches()`` when prepared ahead."""
        xs, ys = batch if batch is not None else self.microbatches(step)
        if self.data_parallel is not None:
            self.data_parallel.begin_step()
        for runner in self.runtime.stages.values():
            runner.new_step()
        loss = self.runtime.step(step, xs, ys)
        if self.tied is not None:  # after the replicas' reductions: the tied copies' sum
            self.tied.sync(self.modules)
        return loss


def build_runners(
    cfg: Config,
    modules: dict[int, nn.Module],
    num_stages: int,
    microbatches: int,
    precision: Precision,
    split: set[int],
    training: bool = True,
    recompute: dict[int, Recompute] | None = None,
) -> dict[int, StageRunner]:
    """A `StageRunner` for each stage module, as a run builds them: the stages in ``split`` have
    a split backward (I and W), ``recompute`` the stages that recompute, and each its own
    `StepWeights` (one cast of its weights a step in a mixed dtype); the rank's ``precision``
    is shared by its stages (one loss scale)."""
    loss = models.kind(cfg.model.kind).loss
    mixed = precision if precision.mixed else None
    recompute = recompute or {}
    return {
        s: StageRunner(
            s,
            mod,
            s == 0,
            s == num_stages - 1,
            loss,
            1.0 / microbatches,
            training,
            s in split,
            mixed,
            recompute.get(s),
            weights=StepWeights(precision.dtype if mixed is not None else None),
        )
        for s, mod in modules.items()
    }


def microbatch_keys(cfg: Config, data_parallel: DataParallel | None = None):
    """(step, microbatch) -> the key of that microbatch's dropout masks on this replica
    (`ppx.models.seeding.microbatch_key`); None for a kind whose units draw nothing (its
    ``SEEDS_UNITS`` unset: ppx's own, without dropout), whose actions then pay nothing for it."""
    from ppx.models.seeding import microbatch_key

    if not getattr(models.kind(cfg.model.kind), "SEEDS_UNITS", False):
        return None
    seed, replica = cfg.train.seed, 0 if data_parallel is None else data_parallel.layout.dp_rank
    return lambda step, mb: microbatch_key(seed, step, replica, mb)


def sample_microbatch(
    cfg: Config, precision: Precision, microbatches: int, device, num_stages: int | None = None
) -> SampleMicrobatch:
    """A microbatch of the run's shapes, for the split backward's trial forward; its
    ``boundaries`` are what each stage but the last hands the next (shape, dtype: float32 in
    the compute dtype), of ``num_stages`` (None: the config's)."""
    kind = models.kind(cfg.model.kind)
    mb_size = cfg.microbatch_size(microbatches)
    n = num_stages if num_stages is not None else resolve_schedule(cfg).num_stages
    handed = [(shape, precision.boundary_dtype(dtype)) for shape, dtype in models.handed_on(cfg, n, mb_size)]
    return SampleMicrobatch(cfg, kind, mb_size, handed, device)


def build_rank(
    cfg: Config, schedule: Schedule, rank: int, device, comm, observers=(), data_parallel: DataParallel | None = None
) -> RankPipeline:
    """Pipeline rank ``rank``'s share; ``data_parallel`` wraps its modules over the replicas."""
    kind = models.kind(cfg.model.kind)
    num_stages = schedule.num_stages
    clock = ActionClock()
    modules = build_stage_modules(cfg, num_stages, schedule.stages_of(rank), device, clock)
    m = schedule.num_microbatches
    split = {a.stage for a in schedule.actions[rank] if a.op is Op.I}
    # stages whose every I is followed at once by its W: one whole backward there, nothing to store
    # (not the known-cost model: its I and W are its own sleeps, its gradients the action's)
    merge = cfg.train.split_backward in ("auto", "drain") and schedule.training and cfg.model.kind != "synthetic"
    whole = whole_backward_stages(schedule, rank) if merge else set()
    # a stage holding no trainable parameter (activations only) has no W to defer: its I is all of it
    bare = (
        set()
        if cfg.model.kind == "synthetic"
        else {s for s in split if not any(p.requires_grad for p in modules[s].parameters())}
    )
    split -= whole | bare
    precision = Precision(cfg.train.dtype, device)
    modes = recompute_modes(cfg.train.recompute, num_stages)
    # a kind whose forward may move buffers (your own model's): each recomputation finds them as its forward did
    moves = getattr(kind, "MOVES_BUFFERS", False)
    recompute = {
        s: Recompute(modes[s], clock, modules[s] if moves else None)
        for s in modules
        if modes[s] != "none" and schedule.training
    }
    runners = build_runners(cfg, modules, num_stages, m, precision, split, schedule.training, recompute)
    sample = sample_microbatch(cfg, precision, m, device, num_stages)  # (what travels: in the compute dtype)
    split_report = {s: set_up_split(cfg, r, s in split and schedule.training, sample) for s, r in runners.items()}
    if schedule.training:
        settle_input_copies(runners, sample)
    for s in split:  # a B among a split stage's I and W: that microbatch runs whole
        runners[s].whole_mbs = frozenset(a.mb for a in schedule.actions[rank] if a.stage == s and a.op is Op.B)
        if runners[s].whole_mbs and split_report.get(s):
            split_report[s]["whole_microbatches"] = sorted(runners[s].whole_mbs)
    for s in whole | bare:  # (never storing: a whole stage's I runs `backward`, which must not take the storing way)
        assert runners[s].store is None, f"stage {s} runs whole and stores"
        runners[s].whole_in_input = True
        why = "each I followed at once by its W" if s in whole else "it holds no parameter, so no W"
        split_report[s] = {"mode": "whole", "why": f"{why}: one backward, in the I"}
        if s not in whole:  # (its I and W are measured apart all the same: I the backward, W nothing)
            split_report[s]["no_parameters"] = True
    if data_parallel is not None:  # wrapped after the trials, which run on the stage's own parameters
        data_parallel.wrap(modules, precision.dtype if precision.mixed else None)
        for s, r in runners.items():  # FSDP2's mixed-precision policy makes the one copy per step
            r.weights.dtype = None
            r.weights.refresh()
            if precision.mixed and s in split:  # its W's gradients into FSDP2's fp32 sum, one by one
                r.after_weight_pass = functools.partial(data_parallel.accumulate, s)
    lookahead = 0 if comm.coalesce else cfg.runtime.recv_lookahead
    runtime = Runtime(
        schedule,
        rank,
        runners,
        comm,
        torch.device(device),
        sample.boundaries.__getitem__,  # (stage s's output, and the gradient it gets back)
        observers,
        recv_lookahead=lookahead,
        clock=clock,
        reduce_grads=None if data_parallel is None else data_parallel.reduce,
        global_ranks=None if data_parallel is None else data_parallel.layout.pipeline_ranks,
        microbatch_key=microbatch_keys(cfg, data_parallel),
    )
    layout = data_parallel.layout if data_parallel is not None else None
    tied = TiedGrads.build(cfg, kind, schedule, rank, modules, layout) if schedule.training else None
    return RankPipeline(
        cfg, schedule, rank, torch.device(device), kind, modules, runtime, data_parallel, precision, split_report, tied
    )
