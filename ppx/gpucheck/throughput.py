"""Throughput: every training schedule at p = the GPU count (a power of two, at most 8; on
one GPU one rank holding its stages), step time, bubble and tokens/s, next to
torch.distributed.pipelining running the same schedule where it has one (GPipe, 1F1B,
interleaved 1F1B).

Runs: a llama (hidden 1024, 16 heads sharing 4 key/value heads, 4 blocks a rank and at least
8, 512 tokens, a 32000-token vocabulary), 4 sequences a microbatch, max(8, 2p) microbatches,
8 steps, fp32 (torch's runtime takes no train.dtype); figures are medians over steps 3 to 7.
Runs go ppx, torch, ppx, torch, ... one after the other (not interleaved step by step as in
`make bench`), so a pair's ratio carries run-to-run noise: 2% is allowed for it."""

from __future__ import annotations

import statistics

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import Missing, RunSpec
from ppx.gpucheck.verdict import Outcome, failed, judged, skipped, table

NAME = "throughput"
TITLE = "Throughput per schedule, ppx against torch.distributed.pipelining"
RATIO_MAX = 1.02
WARMUP = 3  # steps left out: allocator, cuBLAS and NCCL warm-up
TORCH = {"gpipe": "torch_gpipe", "1f1b": "torch_1f1b", "interleaved_1f1b": "torch_interleaved1f1b"}
SCHEDULES = {  # training schedule -> stages per rank (ZB-H1 early: the split check reads it beside 1F1B)
    "gpipe": None,
    "1f1b": None,
    "zb_h1": None,
    "interleaved_1f1b": 2,
    "looped_bfs": 2,
    "zb_h2": None,
    "interleaved_zb": 2,
    "zbv": 2,
    "dualpipev": 2,
}
TIMED = ("1f1b", "zb_h1")  # runs whose timelines (each action's cost) the split check reads
CRITERIA = [
    (
        "ppx / torch.distributed.pipelining step time, same schedule and model, worst of GPipe, 1F1B, interleaved 1F1B",
        f"<= {RATIO_MAX}",
    )
]


def order(machine: Machine) -> list[tuple[str, int | None]]:
    """(schedule, v) in the order they run: each one torch has right before torch's."""
    names = ["1f1b"] if machine.small else list(SCHEDULES)
    out = []
    for name in names:
        out.append((name, SCHEDULES[name]))
        if name in TORCH:
            out.append((TORCH[name], SCHEDULES[name]))
    return out


def plan(machine: Machine) -> list[RunSpec]:
    return [spec(machine, name, v) for name, v in order(machine)]


def spec(machine: Machine, name: str, v: int | None = None) -> RunSpec:
    """The run of schedule ``name`` (``v`` stages per rank) on this machine's model. 1F1B's
    and ZB-H1's keep their timelines, whose action costs the split check reads (the timeline
    is written after the last step: the steps are the same)."""
    p = machine.ranks(8)
    m = max(8, 2 * p) if not machine.small else 4
    if machine.small:
        model = sizes.llama_tiny(32, batch=2 * m, steps=WARMUP + 2)
    else:
        model = sizes.llama(1024, max(8, 4 * p), 16, 4, 512, 32000, batch=4 * m, steps=8)
    keys = {**model, **sizes.pipeline(name, p, m, v), "instrument.timeline": name in TIMED}
    if name in TIMED:  # the costs of the steps after the warm-up
        keys["instrument.timeline_steps"] = model["train.steps"] - WARMUP
    if name == "zb_h1":  # every stage's I and W apart, for the split check (auto runs the first stage's whole)
        keys["train.split_backward"] = "store"
    return RunSpec.of(f"throughput-{name}", keys, sizes.startup_s(p) + sizes.model_seconds(keys, p))


def steady(metrics: list[dict], tokens_per_step: int) -> dict:
    """Medians over the steps after the warm-up: step seconds, bubble, tokens/s."""
    lines = [m for m in metrics if m["step"] >= WARMUP] or metrics
    step = statistics.median(m["step_time_s"] for m in lines)
    bubbles = [m["bubble_fraction"] for m in lines if m.get("bubble_fraction") is not None]
    return {
        "step_s": step,
        "bubble": statistics.median(bubbles) if bubbles else None,
        "tokens_per_s": tokens_per_step / step,
        "steps": len(lines),
    }


def judge_pairs(figures: dict[str, dict]) -> tuple[float, bool, str]:
    pairs = {
        name: figures[name]["step_s"] / figures[t]["step_s"]
        for name, t in TORCH.items()
        if name in figures and t in figures
    }
    if not pairs:
        return float("inf"), False, "no pair ran"
    worst = max(pairs.values())
    return worst, worst <= RATIO_MAX, ", ".join(f"{n} {r:.3f}" for n, r in pairs.items())


def judge(machine: Machine, runs) -> Outcome:
    """A schedule whose run failed or did not fit the time shows why; the pairs that ran are judged."""
    figures, missing, rows = {}, {}, []
    specs = plan(machine)
    for spec in specs:
        name = spec.key("pipeline.schedule")
        try:
            run = runs[spec.name]
        except Missing as e:
            missing[name] = e.result.why
            continue
        tokens = spec.key("train.batch_size") * run.config.model.seq_len
        figures[name] = {**steady(run.metrics, tokens), "device": run.raw_summary["device"]}
    for name, _ in order(machine):
        if name in TORCH.values():
            continue
        row = [name, *_cells(figures.get(name), missing.get(name))]
        if name in TORCH:
            t = TORCH[name]
            row += _cells(figures.get(t), missing.get(t))
            both = name in figures and t in figures
            row.append(f"{figures[name]['step_s'] / figures[t]['step_s']:.3f}" if both else "-")
        else:
            row += ["", "", "", ""]
        rows.append(row)
    lines = [
        f"p={specs[0].key('pipeline.stages')}, m={specs[0].key('pipeline.microbatches')}; medians over steps {WARMUP} and on."
    ]
    lines += table(
        [
            "schedule",
            "ppx step ms",
            "bubble",
            "tokens/s",
            "torch step ms",
            "torch bubble",
            "torch tokens/s",
            "ppx / torch",
        ],
        rows,
    )
    data = {"figures": figures, "missing": missing}
    broken = {n: w for n, w in missing.items() if not w.startswith("time budget")}
    if broken:  # a run that failed fails the check, whatever the others measured
        why = "; ".join(f"{n} failed: {w}" for n, w in broken.items())
        return Outcome([failed(CRITERIA[0][0], why, CRITERIA[0][1])], lines, data)
    if not any(n in figures and t in figures for n, t in TORCH.items()):
        why = "; ".join(f"{n}: {w}" for n, w in missing.items()) or "no pair planned"
        return Outcome([skipped(CRITERIA[0][0], why, CRITERIA[0][1])], lines, data)
    return Outcome([judged(CRITERIA[0][0], *judge_pairs(figures), CRITERIA[0][1])], lines, data)


def _cells(f: dict | None, why: str | None) -> list[str]:
    """step ms, bubble, tokens/s of one run, or why it has none."""
    if f is None:
        return [f"not run: {why}" if why and why.startswith("time budget") else f"failed: {why}", "", ""]
    bubble = "-" if f["bubble"] is None else f"{f['bubble']:.1%}"
    return [f"{f['step_s'] * 1e3:.1f}", bubble, f"{f['tokens_per_s']:,.0f}"]
