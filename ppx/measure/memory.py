"""Memory per stage: microbatches in flight, bytes of saved activations, device peak.

`MemoryTracker` is an observer. Around each forward it installs saved-tensor hooks that note
the storages autograd keeps for backward (parameters excluded). Storages are reference
counted across microbatches, so one buffer saved by several microbatches counts once; a
microbatch's references go when its backward completes. A saved view of data (no grad: an
input or target microbatch cut from the caller's batch, as torch.distributed.pipelining's
schedules cut them) counts its own bytes: the batch behind it is the caller's, not
activation memory, and counting it would hide how many microbatches are in flight. A split
backward that stores (`ppx.engine.weight_store`) drops a microbatch's graph at its I and holds
only the stores until its W: after the I the microbatch holds those tensors instead. Under
``train.recompute`` an I re-runs the forward: the hooks watch the I too, and a stage that keeps
its graph holds what that forward saved until the W. The
step's compute-dtype copies of the weights (`ppx.engine.linears.StepWeights`) are weights, not
activations, and are left out like the parameters. Of what a stage's forward saves, the
bytes the stage before it on the rank saves too (its output handed on in place, at a V's
turn) are reported apart, with when the first of the two let them go (`shared_saves`). It
reports per step the peak number of microbatches in flight on the rank, the peak of live
saved-activation bytes, the bytes of the rank's parameters (``param_bytes``: what a memory
model adds for weights, gradients and optimizer state), and the peak memory over the step,
optimizer step included:
``torch.cuda.max_memory_allocated`` on GPU; on CPU the process's peak resident set (Linux's
VmHWM, reset at each step's start through /proc/self/clear_refs; where that cannot be reset,
the peak since the process started).

The saved bytes are counted in the first ``instrument.memory_steps`` steps only (0: every
step): with fixed shapes they repeat step to step, and the hooks cost about 3 us per saved
tensor, which on a small model is a tenth of its step. The other steps record the device peak
and the microbatches in flight, which cost nothing measurable.
"""

from __future__ import annotations

import re
import resource
import sys
import weakref
from collections.abc import Callable, Sequence

import torch
from torch.autograd.graph import saved_tensors_hooks

from ppx.measure.shared_saves import SharedSaves
from ppx.schedules.ir.action import Op


def reset_cpu_peak() -> None:
    """Start a new peak resident set (Linux >= 4.0); elsewhere the lifetime peak stands."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def cpu_peak_bytes() -> int:
    """The process's peak resident set since the last `reset_cpu_peak`, in bytes."""
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
        if found:
            return int(found.group(1)) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _is_dtensor(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor: none can be before torch.distributed.tensor is imported (data
    parallel imports it), so a run without it does not pay that import (about 0.5 s a rank)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def _local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's own part: a sharded DTensor's local shard, else the parameter."""
    return p.to_local() if _is_dtensor(p) else p


class MemoryTracker:
    """Observer of one rank: ``modules`` are its stages' modules (their parameters are not
    activations), ``training`` whether backwards come, ``in_flight()`` the microbatches the
    rank's executor holds for a backward. ``held_by_store(stage, mb)``: what a storing stage
    holds of a microbatch beside its graph (its layers' inputs; from its I to its W, with their
    output gradients, instead of the graph; None: not storing); ``weight_copies``:
    sets of storage pointers of the step's weight copies (the executor updates them in place);
    ``count_steps``: the saved bytes are counted in steps 0 .. count_steps - 1 (0: every step);
    ``whole_stages``: the stages whose I runs the whole backward (their W nothing), counted as a B;
    ``held_with_graph(stage, mb)``: what a stage that keeps its graph from its I to its W holds
    of ``mb`` beside it (the output gradient its W takes again)."""

    def __init__(
        self,
        modules: dict,
        training: bool,
        in_flight: Callable[[], int],
        device: torch.device,
        held_by_store: Callable[[int, int], list | None] | None = None,
        weight_copies: Sequence[set] = (),
        count_steps: int = 0,
        whole_stages: frozenset = frozenset(),
        held_with_graph: Callable[[int, int], list] | None = None,
    ):
        self.training, self.in_flight, self.device = training, in_flight, device
        self.modules = modules
        self.held_by_store, self.weight_copies = held_by_store, list(weight_copies)
        self.count_steps, self.whole_stages = count_steps, frozenset(whole_stages)
        self.held_with_graph = held_with_graph or (lambda stage, mb: [])
        self._params = self._param_storages()
        self.param_bytes = sum(_local(p).numel() * p.element_size() for m in modules.values() for p in m.parameters())
        # data parallel (torch's replicate / FSDP2): the parameters a forward uses are unsharded
        # copies made inside it, so their storages are looked up again during each forward
        self._unsharded = any(_is_dtensor(p) for mod in modules.values() for p in mod.parameters())
        self._looked = False
        self._hooks = saved_tensors_hooks(self._pack, lambda t: t)
        self.begin_step(-1)

    def begin_step(self, step: int) -> None:
        # a step outside the run's (-1: before the first) counts, as every step does with 0
        self.counting = self.count_steps == 0 or step < self.count_steps
        self.held: dict = {}  # (stage, mb) -> keys of the storages (or data views) it keeps alive
        self._refs: dict = {}  # storage pointer or data view -> [nbytes, references]
        self.live_bytes = self.peak_bytes = self.peak_inflight = 0
        self.per_microbatch: dict[int, int] = {}  # stage -> most bytes one microbatch's forward saved
        self.after_input: dict[int, int] = {}  # stage -> most bytes one microbatch held from its I to its W
        self.shared = SharedSaves()  # what two stages of the rank save between them
        self._seen: dict = {}
        self._fresh: dict = {}  # key -> a weak reference to the storage this forward (or I) saw there
        self._alive: dict = {}  # key -> a weak reference to the storage counted there (gone when it is freed)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_cpu_peak()

    def _param_storages(self) -> set[int]:
        """Storage pointers of the parameters as the modules hold them now (a sharded,
        unused DTensor parameter has none of its own), and of their buffers (a BatchNorm's
        statistics, a constant a forward multiplies by: state every microbatch shares, no
        activation of one)."""
        held = (t for m in self.modules.values() for t in (*m.parameters(), *m.buffers()))
        return {t.untyped_storage().data_ptr() for t in held if not _is_dtensor(t)}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """Autograd's pack hook: note the storage ``t`` keeps alive. Called for every tensor a
        forward saves (169 in a forward of 4 llama blocks), so it does no more than it must. It
        keeps ``t`` detached: a node saving its own output would otherwise hold itself, a cycle
        through autograd's C++ graph that Python's collector never frees, left behind wherever a
        backward does not run that node (a W that takes the weights' gradients alone, under
        ``train.split_backward=graph``, and its stage input's chain)."""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._params:
            return t.detach()
        if self._unsharded and not self._looked:  # once per forward: the unsharded copies' storages
            self._params, self._looked = self._param_storages(), True
            if ptr in self._params:
                return t.detach()
        for copies in self.weight_copies:
            if ptr in copies:
                return t.detach()
        kept = t.detach()
        if t.requires_grad or not t._is_view():
            key, nbytes = ptr, storage.nbytes()
        else:  # a saved view of data: its own bytes
            nbytes = t.numel() * t.element_size()
            key = (ptr, t.storage_offset(), nbytes)
        self._seen[key] = nbytes
        self._fresh[key] = weakref.ref(storage)  # (torch keeps a storage's Python object while it lives)
        return kept

    def before(self, item) -> None:
        if not self.counting:
            return
        # an I too: under train.recompute it re-runs the forward, whose graph a stage that
        # keeps its graph holds until the W (an I that recomputes nothing saves nothing)
        if item.kind == "compute" and (item.actions[0].op is Op.F or item.actions[0].op is Op.I and self.training):
            self._seen, self._fresh, self._looked = {}, {}, False
            self._hooks.__enter__()

    def after(self, item) -> None:
        if item.kind != "compute":
            return
        a = item.actions[0]
        if a.op is Op.F:  # every step: the executor's count, no hooks
            self.peak_inflight = max(self.peak_inflight, self.in_flight())
        if not self.counting:
            return
        if a.op is Op.F:
            self._hooks.__exit__(None, None, None)
            self._note(self._stored(a.stage, a.mb) or ())  # a storing stage keeps its layers' inputs itself
            self._hold(a.stage, a.mb)
        elif a.op in (Op.B, Op.W):
            self._release(self.held.pop((a.stage, a.mb), ()))
        elif a.op is Op.I and self.training:
            self._hooks.__exit__(None, None, None)
            key = (a.stage, a.mb)
            if a.stage in self.whole_stages:  # the whole backward ran here: all freed, nothing held to the W
                self.after_input.setdefault(a.stage, 0)
                self._release(self.held.pop(key, ()))
                self.shared.input_done(a.stage, a.mb, self.held)
                return
            rerun = bool(self._seen)  # the forward the I re-ran (train.recompute)
            kept = self._stored(a.stage, a.mb)
            if kept is not None:  # the graph went at this I (a recomputed one too): the stores stay until W
                self._seen, self._fresh = {}, {}
                self._note(kept)
            else:  # the graph stays, less what the I let go, with the output gradient the W takes again
                self._forget_freed(self.held.get(key, ()))
                self._note(self.held_with_graph(a.stage, a.mb))
            if kept is not None or rerun:  # as the accounting has it: what F saved gone, then what the I holds
                after = sum(self._seen.values())
                self._release(self.held.pop(key, ()))
                self._hold(a.stage, a.mb, count=False)
            else:  # the graph as F saved it, and beside it what the I added
                self._hold(a.stage, a.mb, count=False)
                after = sum(self._refs[k][0] for k in set(self.held.get(key, ())))
            self.after_input[a.stage] = max(self.after_input.get(a.stage, 0), after)
            self.shared.input_done(a.stage, a.mb, self.held)

    def _stored(self, stage: int, mb: int) -> list | None:
        return None if self.held_by_store is None else self.held_by_store(stage, mb)

    def _note(self, tensors) -> None:
        """Tensors held for backward outside autograd's saved ones, by storage."""
        for tensor in tensors:
            key = tensor.untyped_storage().data_ptr()
            self._seen[key] = tensor.untyped_storage().nbytes()
            self._fresh[key] = weakref.ref(tensor.untyped_storage())

    def _forget_freed(self, keys) -> None:
        """Drop, from every holder, the storages among ``keys`` that are freed: a backward let
        them go before the action that releases them in the accounting (torch's I detaches its
        stage's outputs, freeing what only they kept: cross-entropy's log-probabilities). Their
        addresses are free for the next forward's tensors, which would otherwise count as shared."""
        dead = {k for k in keys if k in self._refs and k in self._alive and self._alive[k]() is None}
        if not dead:
            return
        for key in dead:
            nbytes, references = self._refs.pop(key)
            del self._alive[key]
            if references:
                self.live_bytes -= nbytes
        for held in self.held.values():
            held[:] = [k for k in held if k not in dead]

    def _release(self, keys) -> None:
        for ptr in keys:
            ref = self._refs[ptr]
            ref[1] -= 1
            if ref[1] == 0:
                self.live_bytes -= ref[0]
                del self._refs[ptr]
                self._alive.pop(ptr, None)

    def _hold(self, stage: int, mb: int, count: bool = True) -> None:
        """The storages just seen stay alive until microbatch ``mb``'s backward on ``stage``
        (``count``: they are what its forward saved)."""
        if self.training:
            self._forget_freed(list(self._seen))  # (an address freed early, taken again by this forward)
            self._alive.update(self._fresh)
            self._fresh = {}
            if count:
                mb_bytes = sum(self._seen.values())
                self.per_microbatch[stage] = max(self.per_microbatch.get(stage, 0), mb_bytes)
                self.shared.forward(stage, mb, self._seen, self.held)
            self.held.setdefault((stage, mb), []).extend(self._seen)
            for ptr, nbytes in self._seen.items():
                ref = self._refs.setdefault(ptr, [nbytes, 0])
                if ref[1] == 0:
                    self.live_bytes += nbytes
                ref[1] += 1
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def end_step(self, step: int) -> dict:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = cpu_peak_bytes()
        out = {
            "peak_inflight_microbatches": self.peak_inflight,
            "peak_memory_bytes": int(peak),
            "param_bytes": self.param_bytes,
        }
        if not self.counting:  # saved bytes not counted this step: absent, not 0
            return out
        return {
            **out,
            "peak_activation_bytes": self.peak_bytes,
            "saved_bytes_per_microbatch": {str(s): b for s, b in sorted(self.per_microbatch.items())},
            **(
                {"held_after_input_bytes": {str(s): b for s, b in sorted(self.after_input.items())}}
                if self.after_input
                else {}
            ),
            **self.shared.record(),
        }
