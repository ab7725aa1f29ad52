"""bf16: llama-tiny under ``train.dtype=bf16`` (autocast, fp32 master weights, boundaries in
bf16) on the device, on one stage against the model split into stages: the losses agree
within bf16's rounding, and in fp32 they are the same numbers. And a bf16 microbatch saves
about half an fp32 one's bytes, on llama-tiny and the transformer (the device's autocast
keeps fp32 copies where ppx's models do not take care: CUDA's runs norms and the loss in fp32).

Runs: llama-tiny, 16 sequences of 32 tokens in 4 microbatches, 5 SGD steps, in bf16 and in
fp32, at p=1 (one stage) and split: 1F1B on 4 GPUs (2 with 2 or 3), or on one GPU
interleaved 1F1B with 4 stages on one rank; the transformer (hidden 64, 4 blocks) at p=1 in
bf16 and fp32, 2 steps."""

from __future__ import annotations

import math

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.verdict import Outcome, judged, table

NAME = "bf16"
TITLE = "bf16 and fp32 on one stage and split"
BF16_TOL = 2.0**-8  # bf16's unit roundoff (8 significant bits): a relative difference of one rounding
HALF_TOL = 0.10  # a bf16 microbatch's saved bytes within 10% of half an fp32 one's
CRITERIA = [
    ("llama-tiny bf16: split run's losses / p=1's - 1, worst step", f"within 2^-8 = {BF16_TOL:.2e}"),
    ("llama-tiny fp32: split run's losses against p=1's, worst step", "equal (difference 0)"),
    (
        "saved bytes per microbatch, bf16 / fp32 at p=1: llama-tiny, transformer",
        f"0.5 within {HALF_TOL:.0%} (0.45-0.55)",
    ),
]
SAVED_PAIRS = {"llama-tiny": ("bf16-bf16-p1", "bf16-fp32-p1"), "transformer": ("bf16-tf-bf16", "bf16-tf-fp32")}


def split(machine: Machine) -> dict:
    n = machine.ranks(4)
    if n >= 4:
        return sizes.pipeline("1f1b", 4, 4)
    if n >= 2:
        return sizes.pipeline("1f1b", 2, 4)
    return sizes.pipeline("interleaved_1f1b", 1, 4, 4)


def plan(machine: Machine) -> list[RunSpec]:
    out = []
    for dtype in ("bf16", "fp32"):
        for shape, pipe in (("p1", sizes.pipeline("1f1b", 1, 4)), ("split", split(machine))):
            keys = {**sizes.llama_tiny(32, batch=16, steps=5 if not machine.small else 3), **pipe}
            keys.update({"train.dtype": dtype, "train.lr": 0.01, "instrument.timeline": False})
            p = pipe["pipeline.stages"]
            out.append(RunSpec.of(f"bf16-{dtype}-{shape}", keys, sizes.startup_s(p) + 2.0))
        keys = {**sizes.transformer(64, 4, 4, 32, 128, batch=16, steps=2), **sizes.pipeline("1f1b", 1, 4)}
        keys.update({"train.dtype": dtype, "instrument.timeline": False})
        out.append(RunSpec.of(f"bf16-tf-{dtype}", keys, sizes.startup_s(1) + 1.0))
    return out


def loss_gap(losses: list, reference: list) -> float:
    """The largest |loss / reference - 1| over steps; inf when a loss is missing or not finite."""
    if len(losses) != len(reference) or not losses:
        return math.inf
    gaps = []
    for a, b in zip(losses, reference):
        if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
            return math.inf
        gaps.append(abs(a / b - 1))
    return max(gaps)


def judge_gap(gap: float, tol: float) -> tuple[float, bool, str]:
    return gap, gap <= tol, f"{gap:.2e}" if gap else "0 (every step equal)"


def saved_ratio(bf16: dict, fp32: dict) -> float:
    """A bf16 run's saved bytes per microbatch over an fp32 run's (summary.json's, the worst
    stage); inf when either did not count them."""
    a, b = bf16.get("saved_bytes_per_microbatch") or [], fp32.get("saved_bytes_per_microbatch") or []
    if not a or len(a) != len(b) or not all(b):
        return math.inf
    return max((x / y for x, y in zip(a, b)), key=lambda r: abs(r / 0.5 - 1))


def judge_half(ratios: dict[str, float]) -> tuple[float, bool, str]:
    worst = max(abs(r / 0.5 - 1) for r in ratios.values())
    return worst, worst <= HALF_TOL, ", ".join(f"{name} {r:.3f}" for name, r in ratios.items())


def judge(machine: Machine, runs: dict) -> Outcome:
    specs = {s.name: s for s in plan(machine) if not s.name.startswith("bf16-tf-")}
    losses = {name: runs[name].raw_summary["losses"] for name in specs}
    ratios = {model: saved_ratio(runs[bf].raw_summary, runs[fp].raw_summary) for model, (bf, fp) in SAVED_PAIRS.items()}
    rows = [
        judged(
            CRITERIA[0][0],
            *judge_gap(loss_gap(losses["bf16-bf16-split"], losses["bf16-bf16-p1"]), BF16_TOL),
            CRITERIA[0][1],
        ),
        judged(
            CRITERIA[1][0], *judge_gap(loss_gap(losses["bf16-fp32-split"], losses["bf16-fp32-p1"]), 0.0), CRITERIA[1][1]
        ),
        judged(CRITERIA[2][0], *judge_half(ratios), CRITERIA[2][1]),
    ]
    sp = split(machine)
    shape = f"{sp['pipeline.schedule']} p={sp['pipeline.stages']}" + (
        f" v={sp['pipeline.virtual_stages']}" if "pipeline.virtual_stages" in sp else ""
    )
    lines = [f"Split: {shape}; device {runs['bf16-bf16-split'].raw_summary['device']}."]
    lines += table(["run", "losses"], [[name, ", ".join(repr(x) for x in ls)] for name, ls in losses.items()])
    lines += ["", "Saved bytes per microbatch at p=1 (summary.json's saved_bytes_per_microbatch):"]
    lines += table(
        ["model", "bf16 bytes", "fp32 bytes", "bf16 / fp32"],
        [
            [m, *(runs[n].raw_summary.get("saved_bytes_per_microbatch") for n in pair), f"{ratios[m]:.3f}"]
            for m, pair in SAVED_PAIRS.items()
        ],
    )
    return Outcome(rows, lines, {"losses": losses, "saved_ratio": ratios})
