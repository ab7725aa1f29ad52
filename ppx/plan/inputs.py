"""What a plan starts from: costs in seconds and bytes per microbatch, per stage (at one p)
or per layer, the memory budget and how hand-offs behave. `PlanInputs` turns them into
each candidate's per-stage values:

- per layer: a candidate with n = p*v stages gives each stage the sum over the layers
  `ppx.models.split.split_layers(layers, n)` gives it, so every shape does the same work;
- per stage (p fixed): a candidate with v stages per rank cuts each of the p stages into v
  equal parts (cost / v, bytes / v), stage j of the p*v being part of stage j // v;
- per stage of a run (``run_units``: the model's split units in each of the run's stages): a
  candidate's stages hold the units `split_layers` gives them, as the printed command runs
  them (``split_weights``: the run's pipeline.balance; a candidate stage may take units of two
  run stages: llama-tiny's 6 units run as 2, 1, 1, 2 at 4 stages, not in halves of the run's
  3 and 3), each unit taking its share of its run stage's values by its weight
  (``unit_weights``, `ppx.plan.unit_weights`: forward FLOPs for times, the bytes a stage
  holding it keeps for activations (under the run's ``recompute``: a recomputed stage keeps its
  input), parameter bytes for weights (a tied weight once a stage); without them, the split's
  own FLOPs for times, else equal shares).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from statistics import fmean

from ppx.measure.prediction import costs_from
from ppx.models.split import split_layers
from ppx.plan.unit_weights import UnitWeights
from ppx.schedules.sim.costs import Costs, with_actions


@dataclass(frozen=True)
class MeasuredAt:
    """Costs a run's ``run.paired`` entry measured at another stage count than the run's: its
    ``stages``, the model ``units`` each held, its action seconds (``"<stage><op>"`` -> samples;
    a stage it ran whole has B's) and the entries they come from (``sources``)."""

    stages: int
    units: tuple[int, ...]
    action_s: dict
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanInputs:
    """Costs (seconds), bytes and budget of a plan. ``fwd_s``/``bwd_s``/``wgrad_s``: forward,
    input-gradient backward and weight-gradient backward per stage (``stages`` of them) or per
    layer (``per_layer``); ``act_bytes``: bytes one microbatch's forward saves, likewise (None:
    not known, 0); ``param_bytes``: weights, gradients and optimizer state, likewise; ``budget_bytes``:
    per rank for both (None: no limit)."""

    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    wgrad_s: tuple[float, ...]
    per_layer: bool = False
    stages: int | None = None  # the p per-stage values are for; None per layer
    act_bytes: tuple[float, ...] | None = None
    param_bytes: tuple[float, ...] | None = None
    budget_bytes: float | None = None
    p2p_s: float = 0.0
    overhead_s: float = 0.0
    send_post_s: float = 0.0
    recv_post_s: float = 0.0
    reduce_s: tuple[float, ...] | None = None  # a run's data-parallel reduction per stage, or None
    transport: str = "nccl"
    lookahead: int = 0
    source: str = "flags"  # "flags", or the run directory the costs come from
    microbatch_size: int | None = None  # samples per microbatch, when known (a run's)
    samples: dict | None = None  # a run's measured cost samples (`ppx.plan.sampled`), or None: the means
    input_share: tuple[float, ...] | None = None  # per unit, the share of act_bytes an I frees (None: 0)
    # a run's, per stage: of its act_bytes, those the stage before on its rank saves too, and when the
    # first of the two lets them go (`peak_held`'s ``shared``), known at the run's own stage count only
    # (elsewhere counted twice: erring high)
    shared_bytes: tuple[float, ...] | None = None
    shared_until: tuple[str, ...] | None = None
    rank_by: str = "sync"  # the step that ranks candidates (and that zb_auto minimises): "sync" or "steady"
    split_known: bool = True  # False: a run's costs of full backwards only (no I, W apart)
    whole_stages: tuple[int, ...] = ()  # a run's stages that ran their split backward whole (I and W not apart)
    max_stages: int | None = None  # a run's model holds no more stages (its layers), or None
    fixed_stages: int | None = None  # a run's key per stage (``fixed_by``) allows only its own stage count
    fixed_by: str = "pipeline.layers_per_stage"  # that key: its layers per stage, or train.recompute's modes
    run_units: tuple[int, ...] | None = None  # a run's model units (layers, embedding, head) per stage, or None
    recompute: str = "none"  # a run's train.recompute, one mode (what a regrouped stage keeps of its units)
    unit_weights: UnitWeights | None = None  # what each of those units weighs (None: equal shares)
    split_weights: tuple[float, ...] | None = None  # what a candidate's command splits its units by (None: even)
    no_cut_after: tuple[int, ...] = ()  # a run's units handing on no floats (integers): no stage begins after one
    # a drain run's B measured apart on a stage that also split (None there: B costs I + W), or None
    whole_s: tuple[float | None, ...] | None = None
    # a candidate's command runs a stage whose every I its list follows at once by its W as one
    # whole backward, in the I (ppx's runtime under train.split_backward=auto): priced at a B there
    runs_whole: bool = False
    # what entries measured at other stage counts than the run's (`measured_for`), or none
    measured_at: tuple[MeasuredAt, ...] = ()

    @property
    def units(self) -> int:
        """Layers (per layer) or stages (per stage) the value lists hold."""
        return len(self.fwd_s)

    def why_not(self, num_stages: int) -> str | None:
        """Why the values cannot be split into ``num_stages`` stages, or None."""
        if self.max_stages is not None and num_stages > self.max_stages:
            return f"{num_stages} stages but the run's model has {self.max_stages} layers to split: it cannot run"
        if self.fixed_stages is not None and num_stages != self.fixed_stages:
            return f"the run sets {self.fixed_by} for {self.fixed_stages} stages: {num_stages} cannot run"
        cut = self._cut_at_integers(num_stages)
        if cut is not None:
            return (
                f"{num_stages} stages would begin one after unit {cut}, which hands on integers or booleans (a "
                "stage receives floating point): it cannot run"
            )
        if self.per_layer and num_stages > self.units:
            return f"{num_stages} stages but {self.units} layers: every stage needs at least one"
        if not self.per_layer and self.run_units is None and num_stages % self.units and self.units % num_stages:
            return f"{num_stages} stages from costs of {self.units}: neither divides the other"
        return None

    def _cut_at_integers(self, num_stages: int) -> int | None:
        """The first unit in ``no_cut_after`` that the split of the run's units into
        ``num_stages`` (as a candidate's command splits them) ends a stage with, or None."""
        if not self.no_cut_after or self.run_units is None or num_stages == self.stages:
            return None
        ends = [r.stop - 1 for r in split_layers(sum(self.run_units), num_stages, weights=self.split_weights)[:-1]]
        return next((u for u in ends if u in self.no_cut_after), None)

    def parts(self, num_stages: int, by: str = "time") -> list[tuple[tuple[int, float, float], ...]]:
        """Per stage of ``num_stages``: what it is made of, as (unit, numerator, denominator)
        triples: the stage takes numerator / denominator of the unit's value (a whole unit,
        1/1; one of v cuts of a measured stage, 1/v; of a run stage, its model units' weight
        among the stage's, ``by`` "time", "bytes" (kept until the backward, under the run's
        ``recompute``), "graph" (saved, as if nothing were recomputed) or "params", each unit
        weighed as a stage holding it and the units beside it holds it: `UnitWeights.of_stage`)."""
        if self.per_layer:
            return [tuple((i, 1, 1) for i in r) for r in split_layers(self.units, num_stages)]
        if self.run_units is not None and num_stages != self.units:
            w = self.unit_weights
            if w is not None and len(w.flops) == sum(self.run_units):
                return _unit_shares(
                    self.run_units, num_stages, lambda r: w.of_stage(r, by, self.recompute), self.split_weights
                )
            flops = self.split_weights if by == "time" else None  # (a model fake tensors cannot run: its split's FLOPs)
            if flops is None or len(flops) != sum(self.run_units):
                flops = (1.0,) * sum(self.run_units)
            return _unit_shares(self.run_units, num_stages, lambda r: [flops[u] for u in r], self.split_weights)
        if num_stages < self.units:
            k = self.units // num_stages
            return [tuple((i, 1, 1) for i in range(j * k, (j + 1) * k)) for j in range(num_stages)]
        v = num_stages // self.units
        return [((j // v, 1, v),) for j in range(num_stages)]

    def split(self, values, num_stages: int, by: str = "time") -> list[float]:
        """Per-unit ``values`` -> one per stage of ``num_stages`` (`parts`: the module's rules;
        per stage, fewer stages than the values sum groups of them)."""
        return [sum(values[i] * k / n for i, k, n in part) for part in self.parts(num_stages, by)]

    def costs(self, num_stages: int, whole: set[int] = frozenset()) -> Costs:
        """The simulator's costs of a candidate with ``num_stages`` stages; on its ``whole``
        stages (run whole: `runs_whole`) an I costs a B (as measured apart, else I + W) and a W
        nothing."""
        return Costs(
            fwd=self.split(self.fwd_s, num_stages),
            bwd=self.split(self.bwd_s, num_stages),
            wgrad=self.split(self.wgrad_s, num_stages),
            p2p=self.p2p_s,
            overhead=self.overhead_s,
            send_post=self.send_post_s,
            recv_post=self.recv_post_s,
            reduce=self.split(self.reduce_s, num_stages, "params") if self.reduce_s else 0.0,  # gradient bytes
            whole=self._whole(num_stages),
        ).run_whole(whole, num_stages)

    def ran_whole(self, num_stages: int) -> set[int]:
        """The run's stages it ran whole, where a candidate of ``num_stages`` has the run's
        stages as they are: their I's (means or samples) hold the whole backward and their W's
        nothing, so they are priced as they ran, not as a B at the I. (A candidate of another
        count that splits a stage is refused where the run ran one whole: `plan.space`.)"""
        return set(self.whole_stages) if num_stages == self.stages and not self.per_layer else set()

    def _whole(self, num_stages: int) -> list[float] | None:
        """What a B costs per stage of ``num_stages`` where a drain run measured it apart from its
        I and W (a unit without one counts I + W), or None."""
        if self.whole_s is None:
            return None
        units = [b + w if x is None else x for x, b, w in zip(self.whole_s, self.bwd_s, self.wgrad_s)]
        return self.split(units, num_stages)

    def units_at(self, num_stages: int) -> tuple[int, ...] | None:
        """A run's model units per stage of ``num_stages``, as a candidate's command splits them."""
        if self.run_units is None:
            return None
        return tuple(len(r) for r in split_layers(sum(self.run_units), num_stages, weights=self.split_weights))

    def measured_for(self, num_stages: int, apart: set[int] = frozenset()) -> MeasuredAt | None:
        """What an entry measured at ``num_stages`` stages (`MeasuredAt`) that times a candidate
        of that many which runs I and W apart on stages ``apart``: its stages held the units the
        candidate's hold, and it ran I and W apart on ``apart`` (a stage's call costs more than
        its units' share of a bigger stage's); None where none did."""
        for m in self.measured_at:
            a = m.action_s
            if m.stages != num_stages or m.units != self.units_at(num_stages) or self.samples is None:
                continue
            if any(not a.get(f"{st}F") or not (a.get(f"{st}B") or a.get(f"{st}I")) for st in range(num_stages)):
                continue
            if any(not a.get(f"{st}I") or not a.get(f"{st}W") for st in apart):
                continue
            return m
        return None

    def timed_on(self, m: MeasuredAt) -> PlanInputs:
        """These inputs with ``m``'s costs at its stage count; bytes are these inputs', regrouped."""
        a, n = m.action_s, m.stages
        c = costs_from({**self.samples, "action_s": {k: fmean(v) for k, v in a.items() if v}}, n)
        return replace(
            self,
            fwd_s=tuple(c.fwd),
            bwd_s=tuple(c.bwd),
            wgrad_s=tuple(c.wgrad),
            whole_s=tuple(c.whole) if c.whole is not None else None,
            stages=n,
            samples=with_actions(self.samples, a),
            act_bytes=tuple(self.act(n)) if self.act_bytes else None,
            input_share=tuple(self.shares(n)) if self.input_share and self.act_bytes else None,
            shared_bytes=None,  # (another stage count than the run's)
            shared_until=None,
            param_bytes=tuple(self.params(n)) if self.param_bytes else None,
            reduce_s=None,  # (entries run beside one pipeline)
            whole_stages=(),
            max_stages=None,
            fixed_stages=None,
            run_units=None,
            unit_weights=None,
            split_weights=None,
            no_cut_after=(),
            measured_at=(),
        )

    def act(self, num_stages: int) -> list[float]:
        """Bytes one microbatch's forward saves per stage (0 where not given)."""
        return self.split(self.act_bytes, num_stages, "bytes") if self.act_bytes else [0.0] * num_stages

    def shares(self, num_stages: int) -> list[float]:
        """Per stage, the share of its saved bytes an I frees (a run's split backward that
        stores): the units' shares weighted by their bytes (0 where not given)."""
        if not self.input_share or not self.act_bytes:
            return [0.0] * num_stages
        # what an I leaves held (its units' graph, recomputed or not) adds up unit by unit; what a
        # stage keeps from its forward may not (recomputed: its input): freed = kept - held
        held = self.split([(1 - s) * b for s, b in zip(self.input_share, self.act_bytes)], num_stages, "graph")
        return [(b - h) / b if b else 0.0 for h, b in zip(held, self.act(num_stages))]

    def shared(self, num_stages: int) -> list[tuple[float, str] | None] | None:
        """Per stage, (bytes, until) of its saved ones that the stage before on its rank saves
        too (`peak_held`): the run's at its own stage count, else None (not known)."""
        if self.shared_bytes is None or self.shared_until is None or self.per_layer or num_stages != self.stages:
            return None
        return [(b, u) if b else None for b, u in zip(self.shared_bytes, self.shared_until)]

    def params(self, num_stages: int) -> list[float]:
        """Weights, gradients and optimizer state per stage, bytes (0 where not given)."""
        return self.split(self.param_bytes, num_stages, "params") if self.param_bytes else [0.0] * num_stages

    def to_json(self) -> dict:
        """Every field but the samples (thousands of numbers); ``sampled`` says whether there were any."""
        out = asdict(self)
        out["sampled"] = out.pop("samples") is not None
        out["measured_at"] = [{k: v for k, v in m.items() if k != "action_s"} for m in out["measured_at"]]
        return out

    @classmethod
    def from_json(cls, data: dict) -> PlanInputs:
        """The inputs `to_json` wrote (plan.json's ``inputs``), without the samples."""
        fields = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k not in ("sampled", "measured_at")
        }
        if fields.get("unit_weights") is not None:
            fields["unit_weights"] = UnitWeights.from_json(fields["unit_weights"])
        return cls(**fields)


def shared_of_run(shared: dict | None, stages: int) -> dict:
    """PlanInputs' ``shared_bytes`` and ``shared_until`` from a run's summary.json
    ``shared_with_stage_before`` ({"<stage>": {"bytes", "until"}}), or {} where it has none."""
    if not shared:
        return {}
    got = [shared.get(str(s)) for s in range(stages)]
    return {
        "shared_bytes": tuple(float(g["bytes"]) if g else 0.0 for g in got),
        "shared_until": tuple(g["until"] if g else "" for g in got),
    }


def _unit_shares(
    run_units: tuple[int, ...],
    num_stages: int,
    weigh: Callable[[range], list[float]],
    split_weights: tuple[float, ...] | None = None,
) -> list[tuple[tuple[int, float, float], ...]]:
    """Per stage of ``num_stages`` (the model's units split as `split_layers` splits them, by
    ``split_weights``), the (run stage, weight of its units taken, weight of all its units)
    triples it holds; ``weigh(units)``: each unit's weight in a stage that holds ``units``;
    every unit of a run stage whose units weigh 0 weighs 1."""
    owner = [i for i, n in enumerate(run_units) for _ in range(n)]  # model unit -> run stage
    starts = [sum(run_units[:i]) for i in range(len(run_units))]
    total = [sum(weigh(range(a, a + n))) for a, n in zip(starts, run_units)]
    out = []
    for r in split_layers(len(owner), num_stages, weights=split_weights):
        taken: dict[int, float] = {}
        for u, w in zip(r, weigh(r)):
            taken[owner[u]] = taken.get(owner[u], 0.0) + (w if total[owner[u]] > 0 else 1.0)
        out.append(tuple((i, k, total[i] if total[i] > 0 else float(run_units[i])) for i, k in taken.items()))
    return out
