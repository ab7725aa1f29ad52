"""Overlap: DualPipeV's overlapped cells run their forward on a second CUDA stream beside the
backward. A cell's time (its first part's start to its last part's end, CUDA events) against
its F and B run apart:

- on the known-cost model, against the set costs: two GPU spins side by side take the longer
  one, so cell / (F + B) should be max(F, B) / (F + B) = 20 / 30;
- on a transformer large enough to keep the GPU busy, against the same F and B in a run of
  the same order without cells (a schedule CSV): below 1 when the streams overlap at all.

torch runs a backward's kernels on the stream its forward ran on (CUDA semantics: "stream
semantics of backward passes"), so a cell whose B belongs to a forward that itself ran in a
cell (on the second stream) may queue behind its F: the per-cell table shows each cell's ratio.

Runs (one rank, two stages in a V, 8 microbatches, 5 steps, the first left out): the known-cost model (F 10 ms,
B 20 ms); the transformer (hidden 1024, 8 blocks, 512 tokens, 2 sequences a microbatch) with
cells, and in the same order without them."""

from __future__ import annotations

import csv
import dataclasses
import io
import statistics

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.timers import set_costs
from ppx.gpucheck.traces import COMPUTE, by_step, load, timeline_slices
from ppx.gpucheck.verdict import Outcome, judged, skipped, table

NAME = "overlap"
TITLE = "DualPipeV's overlapped cells on two streams"
KC_TOL = 0.03
M = 8
CRITERIA = [
    ("known-cost: cell time / (F + B), median over cells and steps", f"max(F,B)/(F+B) = 0.667 +- {KC_TOL}"),
    ("transformer: cell time / the same F + B run apart, median over cells and steps", "below 1.00"),
]


def cells() -> list[tuple[str, str]]:
    """The (forward, backward) labels of DualPipeV's cells on one rank, 8 microbatches."""
    from ppx.schedules import build

    sched = build("dualpipev", 1, M, None)
    return [(str(f), str(b)) for f, b in (u for u in sched.units(0) if len(u) == 2)]


def apart_csv() -> str:
    """DualPipeV's order on one rank as a schedule CSV without its cells."""
    from ppx.schedules import build
    from ppx.schedules.csv_io import torch_rows

    sched = dataclasses.replace(build("dualpipev", 1, M, None), overlaps=None)
    buf = io.StringIO()
    csv.writer(buf).writerows(torch_rows(sched))
    return buf.getvalue()


def plan(machine: Machine) -> list[RunSpec] | str:
    if not machine.cuda:
        return "needs CUDA: on CPU a cell's two parts run one after the other"
    kc = sizes.known_cost("dualpipev", 1, M, 10.0, 10.0, 10.0, steps=5, v=2)
    real = sizes.transformer(1024, 8, 16, 512, 8192, batch=2 * M, steps=5)
    real_s = sizes.startup_s(1) + sizes.model_seconds(real, 1)
    return [
        RunSpec.of("overlap-kc", kc, sizes.startup_s(1) + sizes.known_cost_seconds(kc)),
        RunSpec.of("overlap-cells", {**real, **sizes.pipeline("dualpipev", 1, M, 2)}, real_s),
        RunSpec.of("overlap-apart", {**real, **sizes.pipeline("csv", 1, M)}, real_s, csv=apart_csv()),
    ]


def cell_times(slices: list[dict], pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[float]]:
    """(F, B) -> per step, the cell's seconds: the later end minus the earlier start."""
    out: dict = {pair: [] for pair in pairs}
    for spans in by_step(slices).values():
        named = {s["name"]: s for s in spans}
        for f, b in pairs:
            if f in named and b in named:
                out[(f, b)].append(
                    max(named[f]["end_s"], named[b]["end_s"]) - min(named[f]["start_s"], named[b]["start_s"])
                )
    return out


def apart_times(slices: list[dict], pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """(F, B) -> the median over steps of F's plus B's seconds, each run on its own."""
    durations: dict = {}
    for s in slices:
        durations.setdefault((s["step"], s["name"]), s["end_s"] - s["start_s"])
    steps = sorted({s["step"] for s in slices})
    out = {}
    for f, b in pairs:
        sums = [durations[(k, f)] + durations[(k, b)] for k in steps if (k, f) in durations and (k, b) in durations]
        if sums:
            out[(f, b)] = statistics.median(sums)
    return out


def ratios(cell: dict, apart: dict) -> dict[tuple[str, str], float]:
    """(F, B) -> median over steps of cell time / apart time."""
    return {pair: statistics.median(t / apart[pair] for t in ts) for pair, ts in cell.items() if ts and apart.get(pair)}


NO_CELL = (float("nan"), False, "no overlapped cell in the run's timeline")


def judge_known_cost(r: dict, expected: float) -> tuple[float, bool, str]:
    if not r:
        return NO_CELL
    med = statistics.median(r.values())
    return med, abs(med - expected) <= KC_TOL, f"{med:.3f} (cells {min(r.values()):.3f}-{max(r.values()):.3f})"


def judge_real(r: dict) -> tuple[float, bool, str]:
    if not r:
        return NO_CELL
    med = statistics.median(r.values())
    return med, med < 1.0, f"{med:.3f} (cells {min(r.values()):.3f}-{max(r.values()):.3f})"


def _kind(label: str) -> str:
    """'1F3' -> '1F': the stage and op a set cost is keyed by."""
    stage, op, _ = COMPUTE.match(label).groups()
    return f"{stage}{op}"


def _slices(run) -> list[dict]:
    """The run's timeline slices after its first step (cuBLAS and the allocator warm up in it)."""
    return [s for s in timeline_slices(load(run.path / "timeline.json")) if s["step"] > 0]


def judge(machine: Machine, runs: dict) -> Outcome:
    specs = plan(machine)
    if isinstance(specs, str):
        return Outcome([skipped(w, specs, t) for w, t in CRITERIA])
    pairs = cells()
    kc = runs["overlap-kc"]
    costs = set_costs(kc.config, kc.raw_summary["stages"])
    set_apart = {(f, b): costs[_kind(f)] + costs[_kind(b)] for f, b in pairs}
    expected = max(costs["0F"], costs["0B"]) / (costs["0F"] + costs["0B"])
    r_kc = ratios(cell_times(_slices(kc), pairs), set_apart)
    cells_run, apart_run = runs["overlap-cells"], runs["overlap-apart"]
    cell, apart = cell_times(_slices(cells_run), pairs), apart_times(_slices(apart_run), pairs)
    r_real = ratios(cell, apart)
    rows = [
        judged(CRITERIA[0][0], *judge_known_cost(r_kc, expected), CRITERIA[0][1]),
        judged(CRITERIA[1][0], *judge_real(r_real), CRITERIA[1][1]),
    ]
    lines = table(
        ["cell (F, B)", "known-cost cell / (F + B)", "transformer cell ms", "apart F + B ms", "ratio"],
        [
            [
                f"{f}, {b}",
                f"{r_kc.get((f, b), float('nan')):.3f}",
                f"{statistics.median(cell[(f, b)]) * 1e3:.2f}" if cell.get((f, b)) else "-",
                f"{apart[(f, b)] * 1e3:.2f}" if (f, b) in apart else "-",
                f"{r_real.get((f, b), float('nan')):.3f}",
            ]
            for f, b in pairs
        ],
    )
    data = {
        "known_cost": {f"{f},{b}": x for (f, b), x in r_kc.items()},
        "transformer": {f"{f},{b}": x for (f, b), x in r_real.items()},
    }
    return Outcome(rows, lines, data)
