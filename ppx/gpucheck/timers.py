"""Timers: on the known-cost model (a GPU spin of a set length per action on CUDA) each
action's timed length (CUDA events; perf_counter on CPU) against its set cost, and each step's
timed extent against the wall-clock step.

Runs: 1F1B (F, B) and ZB-H1 (F, I, W) on one rank, 10 ms forwards, 20 ms backwards (10 + 10
when split), 6 steps of 4 microbatches; the timeline holds the last 5."""

from __future__ import annotations

import statistics

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.traces import by_step, load, timeline_slices
from ppx.gpucheck.verdict import Outcome, judged, pct, table

NAME = "timers"
TITLE = "Timers on the known-cost model"
ACTION_TOL = 0.02  # the bound: each action within 2% of its set cost (median)
STEP_TOL = 0.01  # both span the same GPU work; they differ by a launch and a synchronize (us)
CRITERIA = [
    ("each action's timed length / its set cost, median per kind (F, B, I, W)", f"within {ACTION_TOL:.0%}"),
    ("a step's timed extent (first action's start to last action's end) / its wall-clock step, median", "within 1%"),
]


def plan(machine: Machine) -> list[RunSpec]:
    cases = [("timers-1f1b", sizes.known_cost("1f1b", 1, 4, 10.0, 20.0, 0.0, steps=6))]
    if not machine.small:
        cases.append(("timers-zb_h1", sizes.known_cost("zb_h1", 1, 4, 10.0, 10.0, 10.0, steps=6)))
    return [RunSpec.of(n, k, sizes.startup_s(1) + sizes.known_cost_seconds(k)) for n, k in cases]


def set_costs(cfg, stages: int) -> dict[str, float]:
    """ "<stage><op>" -> the action's set length in seconds (a full B is bwd + wgrad)."""
    from ppx.models.costs import stage_costs_ms

    fwd, bwd, wgrad = stage_costs_ms(cfg.model, stages, cfg.pipeline.layers_per_stage)
    out = {}
    for s in range(stages):
        out.update({f"{s}F": fwd[s], f"{s}B": bwd[s] + wgrad[s], f"{s}I": bwd[s], f"{s}W": wgrad[s]})
    return {k: v / 1e3 for k, v in out.items()}


def action_ratios(samples: dict[str, list[float]], costs: dict[str, float]) -> dict[str, float]:
    """op (F, B, I, W) -> the median over every stage's samples of timed / set length."""
    ratios: dict[str, list[float]] = {}
    for key, xs in samples.items():
        if costs.get(key):
            ratios.setdefault(key[-1], []).extend(x / costs[key] for x in xs)
    return {op: statistics.median(r) for op, r in sorted(ratios.items(), key=lambda kv: "FBIW".index(kv[0]))}


def step_ratios(slices: list[dict], metrics: list[dict]) -> list[float]:
    """Per timeline step and rank: (last slice's end - first slice's start) / the rank's
    wall-clock ``step_s`` in metrics.jsonl."""
    wall = {(line["step"], r["rank"]): r["step_s"] for line in metrics for r in line["ranks"]}
    return [
        (spans[-1]["end_s"] - spans[0]["start_s"]) / wall[key]
        for key, spans in sorted(by_step(slices).items())
        if wall.get(key)
    ]


def judge_actions(ratios: dict[str, float]) -> tuple[float, bool, str]:
    worst = max((r - 1 for r in ratios.values()), key=abs)
    figure = ", ".join(f"{op} {r:.4f}" for op, r in ratios.items()) + f" (worst {pct(worst)})"
    return worst, abs(worst) <= ACTION_TOL, figure


def judge_steps(ratios: list[float]) -> tuple[float, bool, str]:
    med = statistics.median(ratios) - 1
    return med, abs(med) <= STEP_TOL, f"{pct(med)} (median of {len(ratios)}; {min(ratios):.4f}-{max(ratios):.4f})"


def judge(machine: Machine, runs: dict) -> Outcome:
    ratios: dict[str, float] = {}
    steps: list[float] = []
    details = []
    for spec in plan(machine):
        run = runs[spec.name]
        summary = run.raw_summary
        costs = set_costs(run.config, summary["stages"])
        r = action_ratios(summary["cost_samples"]["action_s"], costs)
        s = step_ratios(timeline_slices(load(run.path / "timeline.json")), run.metrics)
        for op, x in r.items():
            ratios[op] = x if op not in ratios or abs(x - 1) > abs(ratios[op] - 1) else ratios[op]
        steps += s
        details.append(
            [
                spec.name,
                summary["device"],
                ", ".join(f"{op} {x:.4f}" for op, x in r.items()),
                f"{statistics.median(s):.4f}",
            ]
        )
    timer = "CUDA events" if machine.cuda else "perf_counter (CPU)"
    rows = [
        judged(CRITERIA[0][0], *judge_actions(ratios), CRITERIA[0][1]),
        judged(CRITERIA[1][0], *judge_steps(steps), CRITERIA[1][1]),
    ]
    lines = [f"Timed by {timer}; set costs F 10 ms, B 20 ms, I 10 ms, W 10 ms."]
    lines += table(["run", "device", "timed / set, median per kind", "timed step / wall step, median"], details)
    return Outcome(rows, lines, {"action_ratios": ratios, "step_ratios": steps})
