"""Profiler: a profiled run's traces hold CUDA kernels under ppx's ``PP:<action>`` labels
(a kernel whose launch falls inside the label's range, on any thread of the rank's process:
autograd launches a backward's kernels from its own device thread), and each
``ProfilerStep#N`` lasts that rank's ``step_s`` of step N.

Run: the transformer (hidden 256, 4 blocks, 256 tokens) under 1F1B at p = min(GPUs, 2), or
interleaved 1F1B with 2 stages on one rank, 4 steps, steps 2 and 3 recorded."""

from __future__ import annotations

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.traces import COMPUTE, load, profiler_traces
from ppx.gpucheck.verdict import Outcome, judged, pct, skipped, table

NAME = "profiler"
TITLE = "Profiler traces"
STEP_TOL = 0.05
CRITERIA = [
    ("compute actions' PP: labels holding a CUDA kernel launched inside them, every rank", "all of them"),
    ("ProfilerStep#N length / the rank's step_s of step N, worst", f"within {STEP_TOL:.0%}"),
]
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def plan(machine: Machine) -> list[RunSpec]:
    p = machine.ranks(2)
    keys = (
        sizes.transformer(32, 4, 2, 16, 64, batch=8, steps=4)
        if machine.small
        else sizes.transformer(256, 4, 4, 256, 1024, batch=16, steps=4)
    )
    keys.update(sizes.pipeline("1f1b", p, 4) if p > 1 else sizes.pipeline("interleaved_1f1b", 1, 4, 2))
    keys.update({"profile.enabled": True, "profile.wait": 1, "profile.warmup": 1, "profile.active": 2})
    keys["instrument.timeline"] = False
    return [RunSpec.of("profiler", keys, sizes.startup_s(p) + 10.0 + sizes.model_seconds(keys, p))]


def _host(events: list[dict]) -> list[dict]:
    """The host's ranges: on CUDA the trace repeats each ``record_function`` range on the GPU's
    rows (``gpu_user_annotation``, from its first kernel to its last), which are not the host's."""
    return [e for e in events if e.get("ph") == "X" and "name" in e and e.get("cat") != "gpu_user_annotation"]


def kernels_under_labels(events: list[dict]) -> tuple[int, int, list[str]]:
    """(compute labels holding a kernel, compute labels, the first few without one)."""
    kernels = {
        e["args"]["correlation"] for e in events if e.get("cat") == "kernel" and "correlation" in e.get("args", {})
    }
    launches = sorted(
        e["ts"]
        for e in events
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATS and e.get("args", {}).get("correlation") in kernels
    )
    labels = [e for e in _host(events) if e["name"].startswith("PP:") and COMPUTE.match(e["name"][3:])]
    empty = []
    for e in labels:
        start, end = e["ts"], e["ts"] + e["dur"]
        if not any(start <= t <= end for t in launches):
            empty.append(e["name"])
    return len(labels) - len(empty), len(labels), empty[:5]


def step_errors(events: list[dict], metrics: list[dict], rank: int) -> dict[int, float]:
    """step N -> ProfilerStep#N's length / the rank's step_s of step N - 1."""
    step_s = {line["step"]: r["step_s"] for line in metrics for r in line["ranks"] if r["rank"] == rank}
    out = {}
    for e in _host(events):
        if e["name"].startswith("ProfilerStep#"):
            n = int(e["name"].split("#")[1])
            out[n] = e["dur"] / 1e6 / step_s[n] - 1
    return out


def judge_kernels(per_rank: dict[int, tuple[int, int, list[str]]]) -> tuple[float, bool, str]:
    held = sum(k for k, _, _ in per_rank.values())
    total = sum(n for _, n, _ in per_rank.values())
    missing = [name for _, _, names in per_rank.values() for name in names]
    figure = f"{held} of {total}" + (f" (none under {', '.join(missing)})" if missing else "")
    return held / total if total else 0.0, total > 0 and held == total, figure


def judge_steps(per_rank: dict[int, dict[int, float]]) -> tuple[float, bool, str]:
    errors = [(rank, n, err) for rank, steps in per_rank.items() for n, err in steps.items()]
    if not errors:
        return float("inf"), False, "no ProfilerStep#N in the traces"
    rank, n, worst = max(errors, key=lambda x: abs(x[2]))
    return worst, abs(worst) <= STEP_TOL, f"worst {pct(worst)} (rank {rank}, step {n}; {len(errors)} steps)"


def judge(machine: Machine, runs: dict) -> Outcome:
    (spec,) = plan(machine)
    run = runs[spec.name]
    traces = profiler_traces(run.path)
    kernels, steps, lines = {}, {}, []
    for rank, path in traces.items():
        events = load(path)["traceEvents"]
        kernels[rank] = kernels_under_labels(events)
        steps[rank] = step_errors(events, run.metrics, rank)
        lines.append(
            [
                rank,
                path.name,
                f"{kernels[rank][0]} of {kernels[rank][1]}" if machine.cuda else "- (CPU)",
                ", ".join(f"#{n} {pct(e)}" for n, e in sorted(steps[rank].items())),
            ]
        )
    rows = [
        judged(CRITERIA[0][0], *judge_kernels(kernels), CRITERIA[0][1])
        if machine.cuda
        else skipped(CRITERIA[0][0], "needs CUDA: a CPU trace has no kernels", CRITERIA[0][1]),
        judged(CRITERIA[1][0], *judge_steps(steps), CRITERIA[1][1]),
    ]
    details = table(["rank", "trace", "compute labels with a kernel", "ProfilerStep#N / step_s - 1"], lines)
    return Outcome(rows, details, {"kernels": {r: k[:2] for r, k in kernels.items()}, "steps": steps})
