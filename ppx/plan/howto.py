"""How to run a plan's best candidate: the `ppx run` overrides its best.csv needs, and for
costs given as flags, the known-cost model's overrides that reproduce them."""

from __future__ import annotations

from pathlib import Path

from ppx.plan.evaluate import Result
from ppx.plan.inputs import PlanInputs


def _ms(values: list[float]) -> str:
    """One value when every stage's is the same, else the list, in ms."""
    texts = [f"{v * 1e3:.6g}" for v in values]
    return texts[0] if len(set(texts)) == 1 else "[" + ",".join(texts) + "]"


def run_overrides(best: Result, csv: Path) -> list[str]:
    """``pipeline.*`` overrides running ``csv`` (its stage-to-rank map is in the file)."""
    out = [f"pipeline.schedule={csv}", f"pipeline.stages={best.p}", f"pipeline.microbatches={best.m}"]
    return out + ([f"pipeline.virtual_stages={best.v}"] if best.v > 1 else [])


def synthetic_overrides(best: Result, inputs: PlanInputs) -> list[str]:
    """The known-cost model (``model.kind=synthetic``) with the candidate's per-stage costs."""
    n = best.p * best.v
    c = inputs.costs(n)
    return [
        "model.kind=synthetic",
        f"model.layers={n}",
        f"model.fwd_ms={_ms(c.fwd)}",
        f"model.bwd_ms={_ms(c.bwd)}",
        f"model.wgrad_ms={_ms(c.wgrad)}",
    ]


def command(best: Result, csv: Path, experiment: str, extra: tuple[str, ...] = ()) -> str:
    """``ppx run <experiment> <the pipeline overrides> <extra>``."""
    return " ".join(["ppx run", experiment, *run_overrides(best, csv), *extra])
