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
entry that ran them (I and W together, never one without the other). A stage a source ran
*whole* (its I followed at once by its W: one backward, in the I) counts as a B of that source.
The forward is the run's own (a storing stage's forward costs a few percent more: the plan
prices a split candidate's F at the run's)."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from ppx.commands.common import split_only_stages, whole_stages


@dataclass(frozen=True)
class RunCosts:
    """``measured_costs`` and ``cost_samples`` as summary.json has them, with what entries
    lent; ``whole_stages``: where some stage's I and W were measured apart, the stages whose
    were not (ran whole, or B's only); ``split_only``: stages split on every microbatch with no
    whole B measured (a B there costs I + W); ``lent``: (what, stages, the entry it came from)."""

    measured_costs: dict
    cost_samples: dict | None
    whole_stages: tuple[int, ...]
    split_only: tuple[int, ...]
    lent: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    # per stage, the share of a microbatch's saved bytes its I frees (summary.json's
    # input_freed_share; an entry's where it lent the I and W), or None
    input_share: tuple[float, ...] | None = None

    def ops(self) -> set[str]:
        """The kinds of action (F, B, I, W) the costs hold."""
        return {key[-1] for key in self.measured_costs["action_s"]}

    def note(self, path: str) -> str | None:
        """The line saying what came from which entry, or None."""
        if not self.lent:
            return None
        from ppx.units import stage_list

        parts = [f"{what} on {stage_list(stages)} from {entry!r}" for what, stages, entry in self.lent]
        return f"note: costs the run did not measure, from run.paired beside it in {path}: " + "; ".join(parts)


def run_costs(run) -> RunCosts:
    """The costs of the run (a `RunDir` with measured costs), its entries' lent where it lacks them."""
    s = run.summary
    shares = run.raw_summary.get("input_freed_share")
    own = RunCosts(
        s.measured_costs,
        s.cost_samples,
        tuple(whole_stages(run)),
        tuple(split_only_stages(run)),
        input_share=tuple(float(x) for x in shares) if shares else None,
    )
    lenders = _lenders(run)
    if not lenders or s.cost_samples is None:
        return own
    stages = s.stages or s.world_size
    means = _by_stage(s.measured_costs["action_s"], set(own.whole_stages))
    draws = _by_stage(s.cost_samples["action_s"], set(own.whole_stages))
    lent: dict[tuple[str, str], list[int]] = {}
    share = list(own.input_share or [0.0] * stages)
    for entry, samples, whole, freed in lenders:
        theirs = _by_stage(samples, whole)
        for stage in range(stages):
            mine, got = draws.setdefault(stage, {}), theirs.get(stage, {})
            wanted = [("B", ("B",)), ("I and W", ("I", "W"))]
            for what, ops in wanted:
                if any(op in mine for op in ops) or not all(got.get(op) for op in ops):
                    continue
                for op in ops:
                    mine[op] = list(got[op])
                    means.setdefault(stage, {})[op] = fmean(got[op])
                if what == "I and W" and stage < len(share):  # what its I frees, as the entry's I freed it
                    share[stage] = float(freed[stage]) if stage < len(freed) else 0.0
                lent.setdefault((what, entry), []).append(stage)
    if not lent:
        return own
    apart = [st for st in range(stages) if "I" in draws.get(st, {})]
    return RunCosts(
        {**s.measured_costs, "action_s": _flat(means, s.measured_costs["action_s"])},
        {**s.cost_samples, "action_s": _flat(draws, s.cost_samples["action_s"])},
        tuple(st for st in range(stages) if st not in apart) if apart else (),  # I and W unknown there
        # (the known-cost model's I + W is its B by construction: nothing priced otherwise)
        () if run.config.model.kind == "synthetic" else tuple(st for st in apart if "B" not in draws[st]),
        tuple((what, tuple(sts), entry) for (what, entry), sts in lent.items()),
        tuple(share) if any(share) else None,
    )


def _lenders(run) -> list[tuple[str, dict, set[int], list]]:
    """(entry, its action seconds, the stages it ran whole, the share of saved bytes its I frees
    per stage) of each ``run.paired`` entry of the run that kept them and costs what the run
    does (`same_costs`), in ``run.paired``'s order."""
    from omegaconf.errors import OmegaConfBaseException

    from ppx.config.paired import same_costs, variants
    from ppx.errors import UserError

    rows = run.raw_summary.get("paired") or {}
    if not any((row or {}).get("cost_samples") for row in rows.values()):
        return []
    try:
        configs = dict(variants(run.config))
    except (UserError, OmegaConfBaseException, OSError, ValueError):  # (a CSV moved since: it lends nothing)
        return []
    out = []
    for entry, row in rows.items():
        samples = ((row or {}).get("cost_samples") or {}).get("action_s")
        other = configs.get(entry)
        try:
            if not samples or other is None or not same_costs(run.config, other):
                continue
        except (UserError, OSError, ValueError):
            continue
        whole = {int(st) for st, way in (row.get("split_backward") or {}).items() if (way or {}).get("mode") == "whole"}
        out.append((entry, samples, whole, row.get("input_freed_share") or []))
    return out


def _by_stage(values: dict, whole: set[int]) -> dict[int, dict[str, object]]:
    """ "<stage><op>" -> value, as stage -> op -> value; on a ``whole`` stage its I is a B (the
    whole backward) and its W (nothing) is left out. Keys of other kinds are left out."""
    out: dict[int, dict[str, object]] = {}
    for key, value in values.items():
        stage, op = key[:-1], key[-1]
        if not stage.isdigit() or op not in "FBIW":
            continue
        st = int(stage)
        if st in whole and op in "IW":
            if op == "W":
                continue
            op = "B"
        out.setdefault(st, {})[op] = value
    return out


def _flat(by_stage: dict[int, dict[str, object]], original: dict) -> dict:
    """`_by_stage`'s inverse, with ``original``'s keys of other kinds (reductions) kept."""
    out = {k: v for k, v in original.items() if not (k[:-1].isdigit() and k[-1] in "FBIW")}
    for st, ops in by_stage.items():
        for op, value in ops.items():
            out[f"{st}{op}"] = value
    return dict(sorted(out.items()))
