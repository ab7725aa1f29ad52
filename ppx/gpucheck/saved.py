"""Saved activations per schedule: each rank's peak of saved activations as the saved-tensor
hooks counted them on the device, against the schedule walked with the bytes one microbatch
saves per stage (``predicted_peak_activation_bytes``), and, for information, the peak
allocated bytes against the memory model (`ppx.gpucheck.memory`).

Runs: the transformer (hidden 512, 4 blocks a rank, 512 tokens) under GPipe, 1F1B,
interleaved 1F1B, ZB-H1, ZB-V and DualPipeV at p = min(GPUs, 4) (the V schedules and
interleaved 1F1B with 2 stages a rank), 8 microbatches, 2 steps."""

from __future__ import annotations

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.memory import rank_errors
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.verdict import Outcome, judged, mib, pct, table

NAME = "saved"
TITLE = "Peak saved activations per schedule"
TOL = 0.05
CRITERIA = [
    ("peak saved activations measured / walked from the schedule, worst schedule and rank", f"within {TOL:.0%}")
]
SCHEDULES = {  # name -> stages per rank
    "gpipe": None,
    "1f1b": None,
    "interleaved_1f1b": 2,
    "zb_h1": None,
    "zbv": 2,
    "dualpipev": 2,
}
SMALL = ("zbv",)  # the test switch: one V schedule, two stages on the rank


def plan(machine: Machine) -> list[RunSpec]:
    p = machine.ranks(4)
    out = []
    for name, v in SCHEDULES.items():
        if machine.small and name not in SMALL:
            continue
        if machine.small:
            keys = sizes.transformer(32, 4, 2, 16, 64, batch=8, steps=2)
        else:
            keys = sizes.transformer(512, 4 * p, 8, 512, 4096, batch=16, steps=2)
        keys.update(sizes.pipeline(name, p, 8 if not machine.small else 4, v), **{"instrument.timeline": False})
        out.append(RunSpec.of(f"saved-{name}", keys, sizes.startup_s(p) + sizes.model_seconds(keys, p)))
    return out


def saved_errors(summary: dict) -> list[tuple[int, int, int, float]]:
    """(rank, measured, predicted, measured / predicted - 1) per rank that saved anything."""
    out = []
    for r in summary["ranks"]:
        measured, predicted = r.get("peak_activation_bytes"), r.get("predicted_peak_activation_bytes")
        if measured is None or predicted is None or not (measured or predicted):
            continue
        out.append((r["rank"], measured, predicted, measured / predicted - 1 if predicted else float("inf")))
    return out


def judge_saved(per_schedule: dict[str, list[tuple]]) -> tuple[float, bool, str]:
    worst = {name: max((e[3] for e in errs), key=abs) for name, errs in per_schedule.items() if errs}
    top = max(worst.values(), key=abs)
    figure = ", ".join(f"{name} {pct(w)}" for name, w in worst.items())
    return top, abs(top) <= TOL and len(worst) == len(per_schedule), figure


def judge(machine: Machine, runs: dict) -> Outcome:
    per_schedule, lines, data = {}, [], {}
    rows = []
    for spec in plan(machine):
        run = runs[spec.name]
        s = run.raw_summary
        name = spec.key("pipeline.schedule")
        errs = saved_errors(s)
        per_schedule[name] = errs
        peaks = {e["rank"]: e for e in rank_errors(s, run.config.train.optimizer)}
        data[name] = {"saved": errs, "peak": list(peaks.values())}
        for rank, measured, predicted, err in errs:
            e = peaks[rank]
            model = (
                "-"
                if not machine.cuda or e["error"] is None
                else f"{mib(e['measured'])}/{mib(e['predicted'])} ({pct(e['error'])})"
            )
            inflight = next(r.get("peak_inflight_microbatches") for r in s["ranks"] if r["rank"] == rank)
            rows.append([name, rank, inflight, mib(measured), mib(predicted), pct(err), model])
    verdict_rows = [judged(CRITERIA[0][0], *judge_saved(per_schedule), CRITERIA[0][1])]
    lines += table(
        [
            "schedule",
            "rank",
            "peak in flight",
            "saved MiB",
            "walked MiB",
            "error",
            "peak allocated / memory model MiB (CUDA; information)",
        ],
        rows,
    )
    return Outcome(verdict_rows, lines, data)
