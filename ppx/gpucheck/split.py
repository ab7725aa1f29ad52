"""Split backward: on a real model, do a zero-bubble schedule's input- and weight-gradient
passes (I + W) cost no more than 1F1B's whole backward (B), and is ZB-H1's step no slower than
1F1B's? (`train.split_backward`, ppx/engine/weight_store.py; `make bench` holds the same on CPU.)

Reads the throughput check's 1F1B and ZB-H1 runs (a run asked for by two checks runs once):
each action's cost from their timelines, after the warm-up steps, per stage. On one rank there
is no bubble for ZB-H1 to fill, so its step is reported, not judged."""

from __future__ import annotations

from ppx.gpucheck import throughput
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.verdict import Outcome, judged, skipped, table

NAME = "split"
TITLE = "A split backward against a whole one, on the throughput model"
IW_MAX = 1.10
CRITERIA = [
    (
        "(I + W) / B per stage: ZB-H1's input- and weight-gradient passes against 1F1B's whole backward, worst stage",
        f"<= {IW_MAX}",
    ),
    ("ZB-H1 step / 1F1B step, same model and microbatches", "< 1 (2+ ranks)"),
]


def plan(machine: Machine) -> list[RunSpec]:
    return [throughput.spec(machine, n, throughput.SCHEDULES[n]) for n in throughput.TIMED]  # 1F1B, then ZB-H1


def stages(action_s: dict, kind: str) -> list[int]:
    """The stages a run measured ``kind`` ("B", "I") on, from its action costs (seconds by
    "<stage><kind>")."""
    return sorted(int(k[:-1]) for k in action_s if k[-1] == kind and k[:-1].isdigit())


def iw_over_b(split_costs: dict, whole_costs: dict, count: int) -> list[float]:
    """(I + W) / B of stages 0..count-1 from two runs' measured action costs (seconds by
    "<stage><kind>")."""
    return [(split_costs[f"{s}I"] + split_costs[f"{s}W"]) / whole_costs[f"{s}B"] for s in range(count)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def judge(machine: Machine, runs) -> Outcome:
    whole_spec, split_spec = plan(machine)
    whole, split = runs[whole_spec.name], runs[split_spec.name]
    b = whole.raw_summary["measured_costs"]["action_s"]
    a = split.raw_summary["measured_costs"]["action_s"]
    p = whole_spec.key("pipeline.stages")
    whole_stages, split_stages = stages(b, "B"), stages(a, "I")
    if not whole_stages or whole_stages != split_stages or stages(a, "W") != split_stages:
        raise ValueError(
            f"1F1B's run measured B on stages {whole_stages}, ZB-H1's I on {split_stages} and W on "
            f"{stages(a, 'W')}: no stage to pair"
        )
    ratios = iw_over_b(a, b, len(whole_stages))
    worst = max(ratios)
    per_stage = ", ".join(f"{r:.3f}" for r in ratios)
    rows = [judged(CRITERIA[0][0], worst, worst <= IW_MAX, f"{worst:.3f} (per stage {per_stage})", CRITERIA[0][1])]
    steps = {n: throughput.steady(r.metrics, 1)["step_s"] for n, r in (("1f1b", whole), ("zb_h1", split))}
    ratio = steps["zb_h1"] / steps["1f1b"]
    figure = f"{ratio:.3f} ({steps['zb_h1'] * 1e3:.1f} / {steps['1f1b'] * 1e3:.1f} ms, p={p})"
    if p == 1:
        rows.append(skipped(CRITERIA[1][0], f"one rank, no bubble for ZB-H1 to fill: {figure}", CRITERIA[1][1]))
    else:
        rows.append(judged(CRITERIA[1][0], ratio, ratio < 1.0, figure, CRITERIA[1][1]))
    ways = split.raw_summary.get("split_backward") or {}
    lines = [
        f"{whole_spec.key('model.kind')} model, m={whole_spec.key('pipeline.microbatches')}; each action's mean over the steps after the warm-up."
    ]
    lines += table(
        ["stage", "1F1B F ms", "1F1B B ms", "ZB-H1 F ms", "ZB-H1 I ms", "ZB-H1 W ms", "(I + W) / B", "ZB-H1's way"],
        [
            [
                s,
                _ms(b[f"{s}F"]),
                _ms(b[f"{s}B"]),
                _ms(a[f"{s}F"]),
                _ms(a[f"{s}I"]),
                _ms(a[f"{s}W"]),
                f"{r:.3f}",
                (ways.get(str(s)) or {}).get("mode", "-"),
            ]
            for s, r in enumerate(ratios)
        ],
    )
    return Outcome(rows, lines, {"iw_over_b": ratios, "step_s": steps, "split_backward": ways})
