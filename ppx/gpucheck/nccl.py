"""NCCL between GPUs: 1F1B and ZB-H1 at p=2 over NCCL give the losses of the same runs on
CPU with gloo (fp32), and on the known-cost model the bubble measured over NCCL is the
schedule's exact theory.

Runs: the transformer (hidden 128, 4 blocks, 64 tokens), 16 sequences in 4 microbatches, 5
SGD steps, 1F1B and ZB-H1 at p=2 on two GPUs and on CPU; the known-cost model (10 ms each of
F, I and W; a full B 20 ms), 1F1B and ZB-H1 at p = min(GPUs, 4), 8 microbatches, 6 steps."""

from __future__ import annotations

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.precision import loss_gap
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.verdict import Outcome, judged, pct, skipped, table

NAME = "nccl"
TITLE = "NCCL between GPUs"
LOSS_TOL = 1e-5
BUBBLE_TOL = 0.03
SCHEDULES = ("1f1b", "zb_h1")
CRITERIA = [
    (f"{s} p=2 fp32: losses over NCCL / on CPU with gloo - 1, worst step", f"within {LOSS_TOL:g}") for s in SCHEDULES
] + [(f"{s} known-cost: measured bubble - theory (idle / step time)", f"within {BUBBLE_TOL}") for s in SCHEDULES]


def plan(machine: Machine) -> list[RunSpec] | str:
    if not machine.cuda:
        return "needs CUDA"
    if machine.gpus < 2:
        return f"needs 2 GPUs (found {machine.gpus}): NCCL refuses two ranks on one GPU"
    out = []
    for s in SCHEDULES:
        keys = {**sizes.transformer(128, 4, 4, 64, 512, batch=16, steps=5), **sizes.pipeline(s, 2, 4)}
        keys.update({"train.lr": 0.01, "instrument.timeline": False})
        for device in ("cuda", "cpu"):
            # the CPU run names its device: the runner's runtime.device gives way to the run's own
            out.append(RunSpec.of(f"nccl-{s}-{device}", {**keys, "runtime.device": device}, sizes.startup_s(2) + 3.0))
    p = machine.ranks(4)
    for s in SCHEDULES:
        wgrad = 10.0 if s == "zb_h1" else 0.0
        keys = sizes.known_cost(s, p, 8, 10.0, 20.0 - wgrad, wgrad, steps=6)
        out.append(RunSpec.of(f"nccl-kc-{s}", keys, sizes.startup_s(p) + sizes.known_cost_seconds(keys)))
    return out


def judge_bubble(summary: dict) -> tuple[float, bool, str]:
    measured, theory = summary["bubble_fraction"], summary["bubble_fraction_theory"]
    gap = measured - theory
    return gap, abs(gap) <= BUBBLE_TOL, f"{measured:.1%} vs {theory:.1%} ({gap:+.3f}; backend {summary['backend']})"


def judge_losses(gpu: dict, cpu: dict) -> tuple[float, bool, str]:
    gap = loss_gap(gpu["losses"], cpu["losses"])
    where = f"{gpu['backend']} vs {cpu['backend']}"
    return gap, gap <= LOSS_TOL and gpu["backend"] == "nccl", f"{gap:.1e} ({where})"


def judge(machine: Machine, runs: dict) -> Outcome:
    specs = plan(machine)
    if isinstance(specs, str):
        return Outcome([skipped(w, specs, t) for w, t in CRITERIA])
    rows, lines = [], []
    for (what, threshold), s in zip(CRITERIA, SCHEDULES):
        gpu, cpu = runs[f"nccl-{s}-cuda"].raw_summary, runs[f"nccl-{s}-cpu"].raw_summary
        rows.append(judged(what, *judge_losses(gpu, cpu), threshold))
        lines.append([s, "losses", ", ".join(f"{a!r}/{b!r}" for a, b in zip(gpu["losses"], cpu["losses"]))])
    for (what, threshold), s in zip(CRITERIA[len(SCHEDULES) :], SCHEDULES):
        summary = runs[f"nccl-kc-{s}"].raw_summary
        rows.append(judged(what, *judge_bubble(summary), threshold))
        ranks = ", ".join(f"rank {r['rank']} {r['bubble_fraction']:.1%}" for r in summary["ranks"])
        lines.append(
            [
                s,
                f"known-cost p={summary['world_size']}",
                f"step {summary['step_time_s'] * 1e3:.1f} ms, over ideal {pct(summary['step_time_over_ideal'] - 1)}; {ranks}",
            ]
        )
    return Outcome(rows, table(["schedule", "runs", "figures (NCCL / CPU)"], lines))
