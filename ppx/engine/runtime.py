"""The executor: runs one rank's validated action list, whatever schedule produced it.

The action list is compiled once into a program of post, wait, compute and drain items
(`ppx.schedules.comms.program`); a batch of sends and receives is posted with batch_isend_irecv
on NCCL. Observers (timers, memory counters, profiler labels, the watchdog, fault
injection) wrap every item through `run_observed`; the runtime itself holds no
instrumentation. Compute actions run inside the rank's `ActionClock`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ppx.engine.observers import run_observed
from ppx.engine.stage import StageRunner
from ppx.errors import said_where
from ppx.models.action_clock import PART_OF, ActionClock
from ppx.models.seeding import microbatch
from ppx.schedules.comms.lowering import peer_of
from ppx.schedules.comms.program import Item, compile_program
from ppx.schedules.ir.action import Action, Op
from ppx.schedules.ir.schedule import Schedule


class ActionFailed(RuntimeError):
    """An item raised; carries the rank, step and item label for the one-line report, and
    ``peer``: the process rank a failed wait was waiting for (None for any other item)."""

    def __init__(self, rank: int, step: int, label: str, cause: BaseException, peer: int | None = None):
        super().__init__(f"rank {rank} failed at step {step} on {label}: {said_where(cause)}")
        self.rank, self.step, self.label, self.peer = rank, step, label, peer


class _Request:
    """A posted send or receive (or, on NCCL, one coalesced group of them), waited on exactly
    once: a gloo request must not be waited twice (a second wait blocks for another message)."""

    __slots__ = ("works", "tensors", "done")

    def __init__(self, works, tensors):
        self.works, self.tensors, self.done = works, tensors, False  # tensors live until done

    def wait(self) -> None:
        if not self.done:
            for w in self.works:
                w.wait()
            self.done = True
            self.tensors = None


class _Pending:
    __slots__ = ("request", "buffer")

    def __init__(self, request: _Request, buffer):
        self.request, self.buffer = request, buffer


class Runtime:
    """Executes ``schedule`` for ``rank``; ``stages`` maps each stage index this rank owns to
    its `StageRunner`. ``boundary(stage)`` gives (shape, dtype) of the activation leaving
    ``stage``, used to allocate receive buffers. ``recv_lookahead``: see `receive_early`.
    ``clock``: the `ActionClock` the stage modules were built with. ``reduce_grads(stage)``
    (data parallel) reduces a stage's gradients across the replicas: the program then has a
    ``reduce`` item per stage after its last backward. ``global_ranks`` (data parallel: this
    replica's process ranks, by pipeline rank) name this rank in errors as the job numbers
    its processes; labels name pipeline ranks, as the schedule does. ``microbatch_key(step,
    mb)`` keys each compute action's dropout masks (`ppx.models.seeding.microbatch`)."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        stages: dict[int, StageRunner],
        comm,
        device: torch.device,
        boundary: Callable[[int], tuple],
        observers: Sequence = (),
        recv_lookahead: int = 0,
        *,
        clock: ActionClock,
        reduce_grads: Callable[[int], None] | None = None,
        global_ranks: Sequence[int] | None = None,
        microbatch_key: Callable[[int, int], int] | None = None,
    ):
        self.schedule, self.rank, self.stages, self.comm = schedule, rank, stages, comm
        self.names = list(global_ranks) if global_ranks is not None else list(range(schedule.num_ranks))
        self.clock = clock  # the one the stage modules were built with: their charges go to its actions
        self.device, self.boundary = device, boundary
        self.observers = list(observers)
        self.program = compile_program(
            schedule.actions[rank],
            schedule.stage_to_rank,
            recv_lookahead,
            schedule.cells(rank),
            reduce=reduce_grads is not None and schedule.training,
        )
        self.reduce_grads = reduce_grads
        self.microbatch_key = microbatch_key
        self.last_stage = schedule.num_stages - 1
        self._handlers = {
            "post": self._post,
            "wait": self._wait,
            "compute": self._compute,
            "reduce": self._reduce,
            "drain": self._drain,
        }
        # overlapped cells on CUDA: the forward and the backward on two streams (`_overlapped`)
        cells = device.type == "cuda" and any(it.overlap for it in self.program)
        self._side = torch.cuda.Stream(device) if cells else None
        # a cell's forward item -> its backward's action (the next item)
        self._cell_backward = {
            id(it): nxt.actions[0] for it, nxt in zip(self.program, self.program[1:]) if it.overlap == 1
        }
        self._on_side: set = set()  # (stage, mb) whose forward ran on the side stream this step
        self.step_index = -1

    # -- one step -------------------------------------------------------------------------
    def step(self, step: int, inputs: list | None, targets: list | None) -> float | None:
        """Run every item of the program once. ``inputs``/``targets`` are the microbatches
        (needed on the ranks owning the first/last stage). Returns the step's loss (sum of
        the scaled microbatch losses = the full-batch loss) on the rank owning the last
        stage, else None."""
        self.step_index = step
        self._inputs, self._targets = inputs, targets
        self._inbox: dict = {}
        self._outbox: dict = {}
        self._requests: list[_Request] = []
        self._loss = None
        self._on_side = set()
        observers, handlers = self.observers, self._handlers
        item = None
        try:
            for item in self.program:
                if item.overlap and self._side is not None:
                    self._overlapped(item)
                else:
                    run_observed(observers, item, handlers[item.kind], item)
        except ActionFailed:
            raise
        except Exception as e:
            raise ActionFailed(
                self.names[self.rank], step, item.label if item else "start", e, self._waited_on(item)
            ) from e
        finally:
            self._inputs = self._targets = None
        return None if self._loss is None else float(self._loss)

    def _waited_on(self, item: Item | None) -> int | None:
        """The process rank a wait item waits for; None for any other item."""
        if item is None or item.kind != "wait":
            return None
        return self.names[peer_of(item.actions[0], self.schedule.stage_to_rank)[0]]

    # -- handlers --------------------------------------------------------------------------
    def _post(self, item: Item) -> None:
        ops, keys = [], []  # posted in the list's order (see `receive_early`)
        s2r = self.schedule.stage_to_rank
        for a in item.actions:
            peer, _ = peer_of(a, s2r)
            # (contiguous: a unit may hand on a transposed view, which the backends refuse to send)
            if a.op is Op.SEND_F:
                ops.append((True, self._outbox.pop(("F", a.stage, a.mb)).contiguous(), peer, "F"))
            elif a.op is Op.SEND_B:
                ops.append((True, self._outbox.pop(("B", a.stage, a.mb)).contiguous(), peer, "B"))
            else:
                kind = "F" if a.op is Op.RECV_F else "B"
                shape, dtype = self.boundary(a.stage - 1 if kind == "F" else a.stage)
                ops.append((False, torch.empty(shape, dtype=dtype, device=self.device), peer, kind))
                keys.append((kind, a.stage, a.mb))
        works = self.comm.post(ops)
        if len(works) == len(ops):  # one request per op (gloo)
            requests = [_Request((w,), (op[1],)) for w, op in zip(works, ops)]
        else:  # one coalesced group (NCCL): every op waits for all of it
            requests = [_Request(tuple(works), [op[1] for op in ops])] * len(ops)
        self._requests += requests
        received = ((op[1], request) for op, request in zip(ops, requests) if not op[0])
        for key, (buf, request) in zip(keys, received):
            self._inbox[key] = _Pending(request, buf)

    def _wait(self, item: Item) -> None:
        a = item.actions[0]
        key = ("F" if a.op is Op.RECV_F else "B", a.stage, a.mb)
        pending = self._inbox[key]
        pending.request.wait()
        self._inbox[key] = pending.buffer

    def _compute(self, item: Item) -> None:
        a = item.actions[0]
        key = None if self.microbatch_key is None else self.microbatch_key(self.step_index, a.mb)
        with self.clock.action(PART_OF[a.op]), microbatch(key):
            self._run_action(a)

    def _reduce(self, item: Item) -> None:
        self.reduce_grads(item.actions[0].stage)

    def _overlapped(self, item: Item) -> None:
        """One part of an overlapped cell on CUDA, its forward (part 1) and its backward (part 2)
        on two streams. Autograd runs a backward's kernels on the stream its forward ran on, so
        a backward whose forward ran in an earlier cell's side stream runs there again: then
        this cell's forward takes the compute stream, else the side one. Both streams first
        wait for everything queued so far (the forward's input among it); after the backward,
        the compute stream waits for both. Observers (CUDA-event timers) record on each part's
        own stream."""
        main, side = torch.cuda.current_stream(self.device), self._side
        a = item.actions[0]
        if item.overlap == 1:
            b = self._cell_backward[id(item)]
            side.wait_stream(main)
            main.wait_stream(side)
            forward = main if (b.stage, b.mb) in self._on_side else side
            if forward is side:
                self._on_side.add((a.stage, a.mb))
            with torch.cuda.stream(forward):
                run_observed(self.observers, item, self._compute, item)
        else:  # the stream its forward ran on, the other one than this cell's forward
            with torch.cuda.stream(side if (a.stage, a.mb) in self._on_side else main):
                run_observed(self.observers, item, self._compute, item)
            main.wait_stream(side)

    def in_flight(self) -> int:
        """Microbatches whose activations this rank holds for a backward still to come."""
        return sum(r.in_flight() for r in self.stages.values())

    def _run_action(self, a: Action) -> None:
        runner = self.stages[a.stage]
        if a.op is Op.F:
            x = self._inputs[a.mb] if runner.first else self._inbox.pop(("F", a.stage, a.mb))
            target = self._targets[a.mb] if runner.last else None
            out = runner.forward(a.mb, x, target)
            if runner.last:
                self._loss = out if self._loss is None else self._loss + out
            elif a.stage + 1 in self.stages:
                self._inbox[("F", a.stage + 1, a.mb)] = out.detach()
            else:
                self._outbox[("F", a.stage, a.mb)] = out.detach()
        elif a.op is Op.W:
            runner.backward_weight(a.mb)
        else:  # B (full backward) or I (input gradients only)
            grad = None if runner.last else self._inbox.pop(("B", a.stage, a.mb))
            grad_in = runner.backward(a.mb, grad) if a.op is Op.B else runner.backward_input(a.mb, grad)
            if runner.first:
                return
            if a.stage - 1 in self.stages:
                self._inbox[("B", a.stage - 1, a.mb)] = grad_in
            else:
                self._outbox[("B", a.stage, a.mb)] = grad_in

    def _drain(self, item: Item) -> None:
        for request in self._requests:
            request.wait()
        self._requests = []
