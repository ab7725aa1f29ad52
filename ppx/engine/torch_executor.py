"""torch.distributed.pipelining as a reference backend inside the harness.

``pipeline.schedule=torch_gpipe | torch_1f1b | torch_interleaved1f1b`` runs torch's own
schedule on the same stage modules and data, in the same run directory with the same
metrics; ``pipeline.executor=torch`` runs any ppx schedule (a name or a CSV) in torch's
runtime instead: ppx's action list, comms included, is written in torch's CSV form and
loaded by ``_PipelineScheduleRuntime._load_csv(..., format="compute_comms")``. Either way, ppx's observers (timers, memory counters, profiler labels, the watchdog) wrap
torch's per-microbatch forward and backward calls, so compute time, bubble and in-flight
counts are measured the same way (torch's communication happens inside its schedule and is
counted as idle/wait). ppx's own list for the same schedule family stands in for the grid,
the theory and the simulator.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import warnings
from pathlib import Path

import torch

from ppx import models
from ppx.engine.buffers import untouched
from ppx.engine.observers import run_observed
from ppx.engine.rank import StageShare, build_stage_modules, microbatch_keys
from ppx.engine.step_batch import StepBatches
from ppx.measure.profiler import RecordFunctions
from ppx.models.action_clock import PART_OF, ActionClock
from ppx.models.seeding import microbatch
from ppx.schedules import registry
from ppx.schedules.comms.program import Item
from ppx.schedules.csv_io import write_csv
from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule


class TorchPipeline(StageShare):
    """One rank of a torch.distributed.pipelining run, with RankPipeline's interface."""

    def __init__(self, cfg, schedule: Schedule, rank: int, device, observers=()):
        import torch.distributed.pipelining as pipelining
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import PipelineScheduleMulti, _PipelineScheduleRuntime

        # a failed action is named by ppx in one line (the watchdog, the launcher); torch's runtime
        # would log its whole schedule to stderr first
        logging.getLogger("torch.distributed.pipelining.schedules").setLevel(logging.CRITICAL)
        self.cfg, self.schedule, self.rank, self.device = cfg, schedule, rank, torch.device(device)
        self.kind = models.kind(cfg.model.kind)
        self.batches = StepBatches(cfg, self.kind, rank)
        self.observers = list(observers)
        self.clock = ActionClock()
        self.live: set = set()  # (stage, microbatch) whose activations torch holds for a backward
        self.open_forward = None  # the last stage's forward item, open until its loss is computed
        self.keys, self.step_index = microbatch_keys(cfg), -1  # each microbatch's dropout masks
        stages = schedule.stages_of(rank)
        self.modules = build_stage_modules(cfg, schedule.num_stages, stages, device, self.clock)
        m = schedule.num_microbatches
        pstages = []
        for s in stages:
            stage = PipelineStage(self.modules[s], s, schedule.num_stages, self.device)
            _infer_untouched(stage, self.modules[s])
            self._wrap(stage, s)
            pstages.append(stage)
        self.pipeline_stages = dict(zip(stages, pstages))
        name = cfg.pipeline.schedule
        # each microbatch's loss scaled by 1/m before its backward, as ppx's runtime does
        # (`StageRunner`), not the summed gradients divided by m after (torch's scale_grads):
        # the same floats where 1/m is inexact (m = 3, 5, 6: they differed in the last bit)
        scale = 1.0 / m
        loss_fn = functools.partial(_scaled_loss, self.kind.loss, scale)
        if registry.is_torch(name):
            cls = getattr(pipelining, registry.TORCH_CLASSES[name])
            first = pstages if issubclass(cls, PipelineScheduleMulti) else pstages[0]
            self.torch_schedule = cls(first, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
        else:  # ppx's own list (comms included), exported to torch's CSV form and run by torch's runtime
            self.torch_schedule = _PipelineScheduleRuntime(
                pstages, n_microbatches=m, loss_fn=loss_fn, scale_grads=False
            )
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "schedule.csv"
                write_csv(schedule, path)
                self.torch_schedule._load_csv(str(path), format="compute_comms")
        self._count_loss_with_forward()  # torch computes the loss after the forward; count it with it

    def in_flight(self) -> int:
        return len(self.live)

    def held_with_graph(self, stage: int, mb: int) -> list:
        """What torch holds of ``mb`` from its I to its W beside the graph (its stage's
        ``backward_state``): the output gradient, the input's gradient (kept on the input), and
        the gradients at the intermediates its W starts from."""
        state = self.pipeline_stages[stage].backward_state.get(mb)
        if state is None:
            return []
        inputs, groups, _, output_grads = state
        held = [g for g in output_grads or () if isinstance(g, torch.Tensor)]
        held += [x.grad for x in inputs or () if isinstance(x, torch.Tensor) and x.grad is not None]
        for group in groups or ():
            for grads in group.get("grads") or ():
                held += [g for g in grads or () if isinstance(g, torch.Tensor)]
        return held

    def _wrap(self, stage, s: int) -> None:
        """Run ppx's observers around torch's per-microbatch forward, backward (full, or
        input-gradient only) and weight-gradient calls, each inside the rank's clock."""

        def wrapped(original, kind):
            def run(op, chunk_id, args, kwargs):
                key = None if self.keys is None else self.keys(self.step_index, chunk_id)
                # torch's first stage skips its I and runs the whole backward in its W
                part = "full" if op is Op.W and stage.stage_index == 0 else PART_OF[op]
                with self.clock.action(part), microbatch(key):
                    out = original(chunk_id, *args, **kwargs)
                if op is Op.F:
                    self.live.add((s, chunk_id))
                elif op is not Op.I:  # B and W free the microbatch's activations
                    self.live.discard((s, chunk_id))
                return out

            def call(chunk_id, *args, **kwargs):
                op = kind
                if kind is Op.B and not kwargs.get("full_backward", args[1] if len(args) > 1 else True):
                    op = Op.I
                item = Item("compute", (Action(s, op, chunk_id),), f"{s}{op.value}{chunk_id}")
                if op is Op.F and stage.is_last:  # its item (and clock) end after the loss torch computes next
                    return forward_with_loss(item, chunk_id, args, kwargs)
                return run_observed(self.observers, item, run, op, chunk_id, args, kwargs)

            def forward_with_loss(item, chunk_id, args, kwargs):
                self._end_forward()
                for o in self.observers:
                    o.before(item)
                key = None if self.keys is None else self.keys(self.step_index, chunk_id)
                self.clock.begin(PART_OF[Op.F])
                try:
                    with microbatch(key):
                        out = original(chunk_id, *args, **kwargs)
                except BaseException:
                    self.clock.end()
                    raise
                self.live.add((s, chunk_id))
                for o in self.observers:  # a label closes where torch's own range around the forward does
                    if isinstance(o, RecordFunctions):
                        o.after(item)
                self.open_forward = item
                return out

            return call

        stage.forward_one_chunk = wrapped(stage.forward_one_chunk, Op.F)
        stage.backward_one_chunk = wrapped(stage.backward_one_chunk, Op.B)
        stage.backward_weight_one_chunk = wrapped(stage.backward_weight_one_chunk, Op.W)

    def _count_loss_with_forward(self) -> None:
        """The last stage's forward item holds the loss torch computes after it (ppx's runtime
        computes it inside the forward): its timers and memory counters count it with it."""
        sched = self.torch_schedule
        original = sched._maybe_compute_loss

        def maybe_compute_loss(*args, **kwargs):
            try:
                out = original(*args, **kwargs)
            except BaseException:  # (its item stays unended, as any item that raises)
                if self.open_forward is not None:
                    self.open_forward = None
                    self.clock.end()
                raise
            self._end_forward()
            return out

        sched._maybe_compute_loss = maybe_compute_loss

    def _end_forward(self) -> None:
        """The observers' ``after`` of the last stage's open forward item, if one is open."""
        item, self.open_forward = self.open_forward, None
        if item is not None:
            self.clock.end()
            for o in reversed(self.observers):
                if not isinstance(o, RecordFunctions):
                    o.after(item)

    def microbatches(self, step: int):
        """This step's whole batch on this rank's device (torch's schedule splits it), made
        before the step as for ppx's runtime, so the copy to a GPU is not timed."""
        x, y = self.batches(step)
        return x.to(self.device), y.to(self.device)

    def step(self, step: int, batch=None):
        self.step_index = step
        x, y = batch if batch is not None else self.microbatches(step)
        losses: list = []
        kwargs = {}
        if self.owns_last:
            kwargs = {"target": y, "losses": losses}
        # (return_outputs=False: torch would keep every microbatch's output to the step's end and
        # join them, memory and time no one reads)
        if self.owns_first:
            self.torch_schedule.step(x, **kwargs, return_outputs=False)
        else:
            self.torch_schedule.step(**kwargs, return_outputs=False)
        self._end_forward()  # (a forward torch computed no loss after)
        if not self.owns_last:
            return None
        return float(sum(v.detach() for v in losses))  # (each scaled by 1/m, added in microbatch order)


def _scaled_loss(loss, scale: float, output, target):
    """``loss(output, target) * scale``: a microbatch's share of the batch's loss."""
    return loss(output, target) * scale


def _infer_untouched(stage, module) -> None:
    """torch finds a stage's shapes by one forward of its first microbatch (stage 0) or of
    uninitialised tensors (the others), in training: run it on copies of the stage's buffers and
    with the generators given back, so a running mean moves as in one process (it had moved by
    that forward's values, garbage on later stages). The method is torch's own (2.4-2.8:
    ``_shape_inference``; since: ``_forward_metadata_inference``)."""
    for name in ("_forward_metadata_inference", "_shape_inference"):
        infer = getattr(stage, name, None)
        if infer is not None:

            def untouched_infer(*args, infer=infer, **kwargs):
                with untouched(module, stage.device):
                    return infer(*args, **kwargs)

            setattr(stage, name, untouched_infer)
            return
    warnings.warn(
        "ppx: torch's stage has no shape-inference method ppx knows: a forward that moves buffers moves them "
        "once more there",
        stacklevel=2,
    )
