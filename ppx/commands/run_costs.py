"""A run's measured costs as ``ppx plan --from-run`` and ``ppx simulate --from-run`` read
them: its own, and where it did not run an action apart, what a ``run.paired`` entry ran beside
it, in the same job and steps (summary.json's ``paired`` rows keep their entries' action
seconds). A 1F1B run beside ZB-H1 that stores (``'run.paired=["pipeline.schedule=zb_h1
train.split_backward=store"]'``) then prices every schedule: its own whole B's, and the
entry's I and W apart; a ZB-H1 run beside 1F1B the same from the other side.

An entry lends only where it costs what the run does, action for action
(`ppx.config.paired.same_costs`: the same config but for the schedule and
``train.split_backward``, over as many stages). Per stage, the run keeps its own B and its
own I and W; a B it never ran whole, or an I and W it never ran apart, come from the first
entry that ran them (I and W together, never one without the other), and only where the entry
split that stage the way the plan's commands will (`ppx.plan.calibrate.commands_way`: a storing
entry lends to commands that store, or to auto's where auto stores too). A stage a source ran
*whole* (its I followed at once by its W: one backward, in the I) counts as a B of that source.
The forward is the run's own; where an entry's forward of a stage costs otherwise (a forward
that stores for a W costs a few percent more), the difference of the medians goes with the B, or
the I, it lends there, which follows that forward in each of its microbatches: a split
candidate's F + I + W is then the storing entry's, and 1F1B's F + B, lent to a run that stored,
1F1B's.

An entry of another stage count (``pipeline.virtual_stages=2`` beside a run of one stage a
rank: `ppx.config.paired.same_layer_costs`) lends nothing to the run's stages; its actions,
whole, price the candidates of its stage count whose stages hold its units (``at_stages``):
a stage's cost is more than its layers' share of a bigger stage's (each call's own work), and
regrouping the run's stages into more cannot see that."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from statistics import fmean

from ppx.commands.common import ran_whole, split_only_stages, whole_stages
from ppx.measure.stalls import STALL, STALL_MIN_S, calm
from ppx.plan.inputs import MeasuredAt
from ppx.units import stage_list


@dataclass(frozen=True)
class RunCosts:
    """``measured_costs`` and ``cost_samples`` as summary.json has them, with what entries
    lent; ``whole_stages``: where some stage's I and W were measured apart, the stages whose
    were not (ran whole, or B's only); ``split_only``: stages split on every microbatch with no
    whole B measured (a B there costs I + W); ``lent``: (what, stages, the entry it came from);
    ``input_share``: per stage, the share of a microbatch's saved bytes its I frees (summary.json's
    input_freed_share; an entry's where it lent the I and W), or None; ``unkept``: entries that
    kept no costs (a run of an older ppx, or without timers); ``other_way``: (entry, stages)
    whose I and W were not lent, split another way than the commands split them; ``at_stages``:
    entries of other stage counts, whose actions price candidates of theirs; ``forward_shift``:
    (entry, stage, op, seconds) where an entry's forward of that stage cost otherwise than the
    run's (medians), that difference added to the B or I it lent there (none from a stage it ran
    drained, whose forwards stored on a few microbatches only)."""

    measured_costs: dict
    cost_samples: dict | None
    whole_stages: tuple[int, ...]
    split_only: tuple[int, ...]
    lent: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    input_share: tuple[float, ...] | None = None
    unkept: tuple[str, ...] = ()
    other_way: tuple[tuple[str, tuple[int, ...]], ...] = ()
    at_stages: tuple[MeasuredAt, ...] = ()
    stalls: int = 0  # samples left out as stalls of the machine (`_without_stalls`)
    forward_shift: tuple[tuple[str, int, str, float], ...] = ()

    def used_by(self, sched, whole: set[int] = frozenset()) -> RunCosts:
        """These costs naming, of what entries lent, only what ``sched`` runs: a B lent for a
        stage the list splits (or an I and W for one it runs whole, ``whole``) prices nothing
        of it."""
        from ppx.schedules.ir.action import Op

        runs = {
            (a.stage, "B" if a.op is Op.B or a.stage in whole else "I and W")
            for row in sched.actions
            for a in row
            if a.op in (Op.B, Op.I)
        }
        lent = tuple(
            (what, kept, e) for what, sts, e in self.lent if (kept := tuple(st for st in sts if (st, what) in runs))
        )
        shifts = tuple(x for x in self.forward_shift if (x[1], "B" if x[2] == "B" else "I and W") in runs)
        return replace(self, lent=lent, forward_shift=shifts)

    def ops(self) -> set[str]:
        """The kinds of action (F, B, I, W) the costs hold."""
        return {key[-1] for key in self.measured_costs["action_s"]}

    def note(self, path: str) -> str | None:
        """The line saying what came from which entry, and what did not, or None."""
        parts = [f"{what} on {stage_list(stages)} from {entry!r}" for what, stages, entry in self.lent]
        parts += [
            f"every action at {a.stages} stages from {', '.join(map(repr, a.sources))}"
            + ("" if all(f"{st}B" in a.action_s for st in range(a.stages)) else " (a B none ran costs its I + W)")
            for a in self.at_stages
        ]
        out = (
            [f"costs the run did not measure, from run.paired beside it in {path}: " + "; ".join(parts)]
            if parts
            else []
        )
        shifts = [
            f"stage {stage} {shift * 1e3:+.3f} ms with the {op}'s of {entry!r}"
            for entry, stage, op, shift in self.forward_shift
            if abs(shift) >= SHIFT_NOTED * fmean(self.cost_samples["action_s"].get(f"{stage}F") or [abs(shift)])
        ]
        if shifts:
            out.append(
                "an entry's forward costs otherwise than the run's (a forward that stores for a W costs more), "
                "and its difference is priced with the backward lent: " + "; ".join(shifts)
            )
        out += [
            f"{entry!r} split {stage_list(stages)} another way than the plan's commands do (train.split_backward): "
            "its I and W are not used there"
            for entry, stages in self.other_way
        ]
        if self.stalls:
            out.append(
                f"{self.stalls} action sample(s) of {path} or its entries over {STALL:g}x their action's median and "
                f"{STALL_MIN_S * 1e3:g} ms above it left out as stalls of the machine"
            )
        if self.unkept:
            out.append(
                f"{', '.join(repr(e) for e in self.unkept)} kept no action costs in {path} (a run of an older ppx, "
                "or instrument.timers or instrument.timeline off): run it again to have them priced"
            )
        return "note: " + "; ".join(out) if out else None


@functools.lru_cache(maxsize=8)
def run_costs_at(path: str) -> RunCosts:
    """`run_costs` of the run directory ``path`` (read once per process: a plan asks several times)."""
    from ppx.report.run_dir import RunDir

    return run_costs(RunDir(path))


SHIFT_NOTED = 0.01  # an entry's forward over the run's, as a share of the run's, that the note names


def run_costs(run) -> RunCosts:
    """The costs of the run (a `RunDir` with measured costs), its entries' lent where it lacks
    them, without stalls (`_without_stalls`)."""
    from ppx.measure.spans import first_timeline_step

    steps = run.config.train.steps - max(0, first_timeline_step(run.config))
    steps -= len((run.raw_summary.get("predicted") or {}).get("stalled_steps_left_out") or [])  # (no samples of theirs)
    return _without_stalls(_with_lent(run), steps)


def _without_stalls(costs: RunCosts, steps: int) -> RunCosts:
    """``costs`` without their stalls: samples over `STALL` times their action's median and
    `STALL_MIN_S` above it, in fewer than half the ``steps`` the samples come from (a cost most
    steps have, such as a step's first forward gathering its weights, stays). A pause of the machine
    (a collection, the OS) once in a run is no action's cost, and a plan's expected step,
    drawing it a few times in a hundred, would charge each step with it (a 65 ms sample among
    40 of 1.2 ms put 25% on a predicted step); their means are taken again, and the note
    counts them."""
    if costs.cost_samples is None:
        return costs
    dropped: dict[str, int] = {}
    kept = calm(costs.cost_samples["action_s"], steps, dropped)
    at = tuple(replace(a, action_s=calm(a.action_s, steps, dropped)) for a in costs.at_stages)
    if not dropped:
        return costs
    changed = [k for k, v in kept.items() if v is not costs.cost_samples["action_s"][k]]
    means = {**costs.measured_costs["action_s"], **{k: fmean(kept[k]) for k in changed}}
    return replace(
        costs,
        measured_costs={**costs.measured_costs, "action_s": means},
        cost_samples={**costs.cost_samples, "action_s": kept},
        at_stages=at,
        stalls=sum(dropped.values()),
    )


def _with_lent(run) -> RunCosts:
    s = run.summary
    shares = run.raw_summary.get("input_freed_share")
    own = RunCosts(
        s.measured_costs,
        s.cost_samples,
        tuple(whole_stages(run)),
        tuple(split_only_stages(run)),
        input_share=tuple(float(x) for x in shares) if shares else None,
    )
    lenders, at_stages, elsewhere_other, unkept = _lenders(run)
    if s.cost_samples is not None:  # (entries of other stage counts: what they ran, or how they split)
        own = replace(own, at_stages=tuple(at_stages), other_way=tuple(elsewhere_other))
    if not lenders or s.cost_samples is None:
        return replace(own, unkept=tuple(unkept))
    stages = s.stages or s.world_size
    draws = _by_stage(s.cost_samples["action_s"], set(own.whole_stages))
    lent: dict[tuple[str, str], list[int]] = {}
    other: dict[str, list[int]] = {}
    share = list(own.input_share or [0.0] * stages)
    shifted: list[tuple[str, int, str, float]] = []
    for entry, samples, whole, freed, matches, drained in lenders:
        theirs = _by_stage(samples, whole)
        for stage in range(stages):
            mine, got = draws.setdefault(stage, {}), theirs.get(stage, {})
            for what, ops in (("B", ("B",)), ("I and W", ("I", "W"))):
                if any(op in mine for op in ops) or not all(got.get(op) for op in ops):
                    continue
                if what == "I and W" and stage not in matches:
                    other.setdefault(entry, []).append(stage)
                    continue
                # the entry's forward here over the run's (a storing forward costs more): its cost
                # goes with the backward lent, which follows that forward in every microbatch
                shift = 0.0 if stage in drained else _forward_shift(got.get("F"), mine.get("F"))
                for op in ops:
                    mine[op] = [max(0.0, x + shift) for x in got[op]] if shift and op == ops[0] else list(got[op])
                if shift:
                    shifted.append((entry, stage, ops[0], shift))
                if what == "I and W" and stage < len(share):  # what its I frees, as the entry's I freed it
                    share[stage] = float(freed[stage]) if stage < len(freed) else 0.0
                lent.setdefault((what, entry), []).append(stage)
    if not lent:
        return replace(own, unkept=tuple(unkept), other_way=_stages(other) + own.other_way)
    apart = [st for st in range(stages) if "I" in draws.get(st, {})]
    flat = _flat(draws, s.cost_samples["action_s"])
    kept = s.cost_samples["action_s"]
    means = {  # the run's own means where its samples stand as they were, else theirs
        k: s.measured_costs["action_s"][k] if kept.get(k) is v and k in s.measured_costs["action_s"] else fmean(v)
        for k, v in flat.items()
    }
    return RunCosts(
        {**s.measured_costs, "action_s": means},
        {**s.cost_samples, "action_s": flat, "first_s": _own_first(s.cost_samples, flat, own.whole_stages, lent)},
        tuple(st for st in range(stages) if st not in apart) if apart else (),  # I and W unknown there
        # (the known-cost model's I + W is its B by construction: nothing priced otherwise)
        () if run.config.model.kind == "synthetic" else tuple(st for st in apart if "B" not in draws[st]),
        tuple((what, tuple(sts), entry) for (what, entry), sts in lent.items()),
        tuple(share) if any(share) else None,
        tuple(unkept),
        _stages(other) + own.other_way,
        own.at_stages,
        forward_shift=tuple(shifted),
    )


def _own_first(samples: dict, flat: dict, whole: tuple[int, ...], lent: dict) -> dict:
    """The run's microbatch 0 samples (``first_s``) for the keys of ``flat`` whose lists are
    still the run's own: none where an entry lent the list (its values are another run's, and
    `split_first` matches them by value); a ``whole`` stage's under its B, which its I's are."""
    first, kept = samples.get("first_s") or {}, samples["action_s"]
    lent_b = {st for (what, _), sts in lent.items() if what == "B" for st in sts}
    out = {}
    for key, values in flat.items():
        stage = int(key[:-1]) if key[:-1].isdigit() else None
        if kept.get(key) is values and key in first:
            out[key] = first[key]
        elif key[-1] == "B" and stage in whole and stage not in lent_b:  # (its own I's, and B's if any)
            out[key] = [*first.get(f"{stage}I", ()), *first.get(f"{stage}B", ())]
    return out


def _forward_shift(theirs: list | None, mine: list | None) -> float:
    """Seconds an entry's forward of a stage costs over the run's, 0 where either is unknown: the
    difference of the medians (a cost every forward has; the tails are in the samples already)."""
    from statistics import median

    return median(theirs) - median(mine) if theirs and mine else 0.0


def _stages(by_entry: dict[str, list[int]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((entry, tuple(sts)) for entry, sts in by_entry.items())


def _lenders(
    run,
) -> tuple[list[tuple[str, dict, set[int], list, set[int], set[int]]], list[MeasuredAt], list, list[str]]:
    """(entry, its action seconds, the stages it ran whole, the share of saved bytes its I frees
    per stage, the stages it split as the plan's commands split them, the stages it ran drained:
    some microbatches whole) of each ``run.paired`` entry
    of the run that kept them and costs what the run does (`same_costs`), in ``run.paired``'s
    order; the entries of other stage counts that cost the same layer for layer
    (`same_layer_costs`) and split every stage they split as the commands do, merged by stage
    count and units (each stage's F, B, and I with W from the first that ran them); (entry,
    stages) of those that split stages another way, which lend nothing; and the entries that
    kept none."""
    from omegaconf.errors import OmegaConfBaseException

    from ppx.config.paired import same_costs, same_layer_costs, variants
    from ppx.errors import UserError
    from ppx.plan.calibrate import commands_way

    rows = run.raw_summary.get("paired") or {}
    unkept = [e for e, row in rows.items() if not (row or {}).get("cost_samples")]
    if len(unkept) == len(rows):
        return [], [], [], unkept
    try:
        configs = dict(variants(run.config))
        way = commands_way(run.config)
    except (UserError, OmegaConfBaseException, OSError, ValueError):  # (a CSV moved since: it lends nothing)
        return [], [], [], unkept
    out, elsewhere, other_way = [], {}, []
    for entry, row in rows.items():
        samples = ((row or {}).get("cost_samples") or {}).get("action_s")
        other = configs.get(entry)
        try:
            if not samples or other is None or not same_layer_costs(run.config, other):
                continue
            here = same_costs(run.config, other)
        except (UserError, OSError, ValueError):
            continue
        ways = {int(st): info or {} for st, info in (row.get("split_backward") or {}).items()}
        whole = {st for st, info in ways.items() if ran_whole(info)}
        stages = {int(k[:-1]) for k in samples if k[:-1].isdigit()}
        matches = {st for st in stages if _as_commands(way, ways.get(st))}
        if here:
            drained = {st for st, info in ways.items() if info.get("whole_microbatches")}  # (few forwards stored)
            out.append((entry, samples, whole, row.get("input_freed_share") or [], matches, drained))
        elif not matches >= stages - whole:  # (the note names it: split another way)
            other_way.append((entry, tuple(sorted(stages - whole - matches))))
        elif row.get("units_per_stage"):
            names, got = elsewhere.setdefault((len(stages), tuple(row["units_per_stage"])), ([], {}))
            names.append(entry)
            for stage, ops in _by_stage(samples, whole).items():  # the first entry's of each op (I and W together)
                mine = got.setdefault(stage, {})
                for pair in (("F",), ("B",), ("I", "W")):
                    if not any(op in mine for op in pair) and all(ops.get(op) for op in pair):
                        mine.update({op: ops[op] for op in pair})
    at = [MeasuredAt(n, units, _flat(got, {}), tuple(names)) for (n, units), (names, got) in elsewhere.items()]
    return out, at, other_way, unkept


def _as_commands(way: str | None, info: dict | None) -> bool:
    """Whether a stage an entry split as ``info`` says (its summary's split_backward) ran as the
    plan's commands split it (``way``: `commands_way`)."""
    # (ppx's runtime chose nothing: the known-cost model, torch's executor; a stage of no
    # parameter runs one way under every way)
    if way is None or not info or info.get("no_parameters"):
        return True
    mode = info.get("mode")
    if way != "auto":
        return mode == way
    if mode == "store":  # auto stores where the stores hold no more than the graph
        return info.get("store_bytes", 0) <= info.get("graph_bytes", 0)
    return mode == "graph" and info.get("why") != "train.split_backward=graph"  # (auto's own choice)


def _by_stage(values: dict, whole: set[int]) -> dict[int, dict[str, list]]:
    """ "<stage><op>" -> samples, as stage -> op -> samples; on a ``whole`` stage its I's are B's
    (the whole backward, joined to any B's it ran) and its W (nothing) is left out. Keys of
    other kinds are left out; lists not joined are the ones given."""
    out: dict[int, dict[str, list]] = {}
    for key, value in values.items():
        stage, op = key[:-1], key[-1]
        if not stage.isdigit() or op not in "FBIW":
            continue
        st = int(stage)
        if st in whole and op in "IW":
            if op == "W":
                continue
            op = "B"
        ops = out.setdefault(st, {})
        ops[op] = value if op not in ops else [*ops[op], *value]
    return out


def _flat(by_stage: dict[int, dict[str, list]], original: dict) -> dict:
    """`_by_stage`'s inverse, with ``original``'s keys of other kinds (reductions) kept."""
    out = {k: v for k, v in original.items() if not (k[:-1].isdigit() and k[-1] in "FBIW")}
    for st, ops in by_stage.items():
        for op, value in ops.items():
            out[f"{st}{op}"] = value
    return dict(sorted(out.items()))
