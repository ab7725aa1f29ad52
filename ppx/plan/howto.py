"""How to run a plan's best candidate, as printed: the `ppx run` overrides its best.csv needs;
for costs given as flags, the known-cost model at the planned costs (a command that runs as
printed, on the shipped `EXPERIMENT`); for a run's costs, that run's config with what the
candidate's shape changes in it (the known-cost model's per-stage cost lists for p·v stages,
a batch that divides into m). `check` loads a command's config as `ppx run` would, so a
command that would fail is caught before it is printed."""

from __future__ import annotations

import shlex
from pathlib import Path

from ppx.plan.evaluate import Result
from ppx.plan.inputs import PlanInputs

EXPERIMENT = "1f1b_2cpu"  # shipped; CPU, gloo: runs on any machine
COST_KEYS = ("fwd_ms", "bwd_ms", "wgrad_ms")


def _ms(values: list[float]) -> str:
    """One value when every stage's is the same, else the list, in ms."""
    texts = [f"{v * 1e3:.6g}" for v in values]
    return texts[0] if len(set(texts)) == 1 else "[" + ",".join(texts) + "]"


def run_overrides(best: Result, csv: Path | str) -> list[str]:
    """``pipeline.*`` overrides running ``csv`` (its stage-to-rank map is in the file), or a
    family by name."""
    out = [f"pipeline.schedule={csv}", f"pipeline.stages={best.p}", f"pipeline.microbatches={best.m}"]
    return out + ([f"pipeline.virtual_stages={best.v}"] if best.v > 1 else [])


def synthetic_overrides(best: Result, inputs: PlanInputs) -> list[str]:
    """The known-cost model (``model.kind=synthetic``) with the candidate's per-stage costs, a
    batch of m samples (one per microbatch) and the plan's transport's placement."""
    n = best.p * best.v
    c = inputs.costs(n)
    return [
        "model.kind=synthetic",
        f"model.layers={n}",
        "model.cost_per=stage",
        f"model.fwd_ms={_ms(c.fwd)}",
        f"model.bwd_ms={_ms(c.bwd)}",
        f"model.wgrad_ms={_ms(c.wgrad)}",
        f"train.batch_size={best.m}",
    ]


def from_run_overrides(best: Result, cfg, inputs: PlanInputs) -> list[str]:
    """What a candidate changes in the run's config ``cfg`` besides the schedule: the known-cost
    model's per-stage cost lists for p·v stages (split as the plan splits the run's costs) and
    enough layers; at another m than the run's, the batch of m microbatches of the run's size
    (what the plan costed: a batch kept whole would change the microbatch); and,
    from a run that set ``train.split_backward`` (the calibration run's store), auto for a
    candidate that splits no backward (there the key changes nothing, and ppx run says so) and
    for every candidate of a drain run (its CSV is the list as planned, every backward split or,
    ``+drain``, drained already: drain would drain a family's list again); the run's
    pipeline.balance where it split its units evenly (a config.yaml from before the key, read
    back so, would otherwise run the new default); none of the run's run.paired entries (the
    candidate is what was planned, not the run's comparison); and no v of the run's for a
    candidate of one stage per rank."""
    from ppx import models
    from ppx.plan.space import splits

    out, n, model = ["run.dir=null"], best.p * best.v, cfg.model
    if best.v == 1 and cfg.pipeline.virtual_stages is not None:  # (run_overrides names v only above 1)
        out.append("pipeline.virtual_stages=null")
    way = cfg.train.split_backward
    if way == "drain" or way != "auto" and not splits(best.schedule):
        out.append("train.split_backward=auto")
    if model.kind == "synthetic" and model.cost_per == "stage":
        for key in COST_KEYS:  # every stage costs its value whatever its layers: a cut stage costs its part
            value = getattr(model, key)
            values = list(value) if isinstance(value, (list, tuple)) else [value] * inputs.units
            if n != inputs.units:
                out.append(f"model.{key}={_ms([x / 1e3 for x in inputs.split(values, n)])}")
        if n > model.layers:
            out.append(f"model.layers={n}")
    if cfg.run.paired:
        out.append("run.paired=[]")
    if cfg.pipeline.balance != "flops" and cfg.model.kind in models.WEIGHED:  # the split the plan costed
        out.append(f"pipeline.balance={cfg.pipeline.balance}")
    if best.m != cfg.pipeline.microbatches:  # the run's microbatch size, as the plan costed it
        out.append(f"train.batch_size={cfg.train.batch_size // cfg.pipeline.microbatches * best.m}")
    return out


def run_command(experiment: str, overrides: list[str]) -> str:
    """``ppx run <experiment> <overrides>``, as printed: a path or value with a space or a quote
    in quotes, as a shell reads it (a list's brackets are left bare, as the docs write them)."""
    return " ".join(["ppx run", *(_word(w) for w in [experiment, *overrides])])


def _word(text: str) -> str:
    return shlex.quote(text) if any(c.isspace() or c in "'\"" for c in text) else text


def command(best: Result, csv: Path | str, experiment: str, extra: tuple[str, ...] = ()) -> str:
    """``ppx run <experiment> <the pipeline overrides> <extra>``."""
    return run_command(experiment, [*run_overrides(best, csv), *extra])


def planned_overrides(r: Result, schedule: Path | str, inputs: PlanInputs, run_cfg=None) -> list[str]:
    """The `ppx run` overrides that run candidate ``r`` as planned: on a run's config
    (``run_cfg``) with what its shape changes there, or on the known-cost model at the planned
    costs."""
    extra = from_run_overrides(r, run_cfg, inputs) if run_cfg is not None else synthetic_overrides(r, inputs)
    return [*run_overrides(r, schedule), *extra]


def full_command(r: Result, schedule: Path | str, experiment: str, inputs: PlanInputs, run_cfg=None) -> str:
    """``ppx run <experiment>`` with `planned_overrides`."""
    return run_command(experiment, planned_overrides(r, schedule, inputs, run_cfg))


def check(text: str) -> str | None:
    """Why the printed ``ppx run`` command ``text`` would fail its config checks, or None."""
    from ppx import config
    from ppx.errors import UserError

    words = shlex.split(text)
    try:
        config.load(words[2], [w for w in words[3:] if "=" in w])
    except UserError as e:
        return str(e)
    return None
