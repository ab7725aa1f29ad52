"""`make bench`'s split costs in one process: what splitting a stage's backward costs, without
the noise of whole runs (`bench/run.py --split-costs`).

The whole-run rows (bench/split_backward.py) read (I + W) / B from two different runs (1F1B's
B, ZB-H1's I and W), and on this VM one run's actions move 10-30% against another's: the same
configuration read 1.03, 1.06 and an hour later 1.14, 1.34. Here one process builds a stage
twice from the same config and seed, once as 1F1B runs it (F, then B) and once as a storing
split backward runs it (its storing F, then I, then W), and times both on the same microbatch,
`STEPS` steps of M microbatches (a step's lookups and casts once in its M, as in a run), one
thread. Which of the two goes first alternates from microbatch to
microbatch: the one that runs first after the other pays for the caches the other left
(measured: the same code in both places read 1.13 against 1.06 when one always went first,
1.085 against 1.091 alternated). Rows: (I + W) / B per stage (the issue's target, 1.10) and
the whole microbatch, (F + I + W) / (F + B), the storing forward included.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from bench.split_backward import MODELS, SHAPE, M

P = 2  # the stages of each configuration (as the p=2 rows of bench/split_backward.py)
STEPS = 25  # steps of M microbatches timed per variant and stage (after `WARMUP_STEPS`)
WARMUP_STEPS = 3
CONFIGS = {f"{model} {dtype}": (model, dtype) for model in MODELS for dtype in ("fp32", "bf16")}


def _runners(cfg, stage: int):
    """(1F1B's runner, a storing split runner) of ``stage``, the same weights, and a sample
    microbatch (input, target, output gradient)."""
    from ppx.engine.precision import Precision
    from ppx.engine.rank import build_runners, build_stage_modules, sample_microbatch
    from ppx.engine.split_setup import set_up_split

    m = cfg.pipeline.microbatches
    precision = Precision(cfg.train.dtype, "cpu")
    sample = sample_microbatch(cfg, precision, m, "cpu")
    runners = []
    for split in (False, True):
        modules = build_stage_modules(cfg, P, [stage], "cpu")
        (runner,) = build_runners(cfg, modules, P, m, precision, {stage} if split else set()).values()
        info = set_up_split(cfg, runner, split, sample)
        if split and (info or {}).get("mode") != "store":
            raise SystemExit(f"bench split costs: stage {stage} does not store ({info})")
        runners.append(runner)
    x, target = sample.of(runners[0])
    out = runners[0].trial(x, target)[1]
    grad = None if stage == P - 1 else torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    return runners, (x, target, grad)


def measure(model: str, dtype: str, stage: int, steps: int = STEPS, warmup_steps: int = WARMUP_STEPS) -> dict:
    """Seconds a microbatch of F and B (1F1B's way) and of the storing F, I and W take on
    ``stage`` of (``model``, ``dtype``) over ``P`` stages, the two ways alternating which goes
    first: the median step's M microbatches over M (a step's lookups and casts come once in
    its M, as in a run)."""
    from ppx import config

    exp, *keys = MODELS[model]
    cfg = config.load(
        exp, [*keys, *SHAPE, f"train.dtype={dtype}", f"pipeline.stages={P}", "train.split_backward=store"]
    )
    (plain, split), (x, target, grad) = _runners(cfg, stage)
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {k: [] for k in ("F", "B", "Fs", "I", "W")}

    def timed(key: str, fn) -> None:
        start = time.perf_counter()
        fn()
        times[key].append(time.perf_counter() - start)

    def whole(rep: int) -> None:
        if rep % M == 0:  # a step's first microbatch: the step's lookups and casts, once per M
            plain.new_step()
        timed("F", lambda: plain.forward(0, x, target))
        timed("B", lambda: plain.backward(0, grad))

    def storing(rep: int) -> None:
        if rep % M == 0:
            split.new_step()
        timed("Fs", lambda: split.forward(0, x, target))
        timed("I", lambda: split.backward_input(0, grad))
        timed("W", lambda: split.backward_weight(0))

    gc.collect()
    gc.disable()  # as a run keeps Python's collector out of its steps (ppx/engine/garbage.py)
    try:
        for rep in range((warmup_steps + steps) * M):
            for fn in (whole, storing) if rep % 2 == 0 else (storing, whole):
                fn(rep)
    finally:
        gc.enable()
    med = {k: statistics.median(_steps(v[warmup_steps * M :])) / M for k, v in times.items()}
    return {
        "median_s": med,
        "iw_over_b": (med["I"] + med["W"]) / med["B"],
        "microbatch_ratio": (med["Fs"] + med["I"] + med["W"]) / (med["F"] + med["B"]),
        "steps": steps,
    }


def _steps(seconds: list[float]) -> list[float]:
    """Per-microbatch times summed step by step (M to a step)."""
    return [sum(seconds[i : i + M]) for i in range(0, len(seconds) - M + 1, M)]


def check_all(only: str | None = None) -> dict:
    """`measure` for every configuration's stages (or those whose name holds ``only``)."""
    from bench.split_backward import matching

    out = {}
    for name in matching(CONFIGS, only, "--split-costs"):
        model, dtype = CONFIGS[name]
        out[name] = {str(s): measure(model, dtype, s) for s in range(P)}
        got = ", ".join(f"{v['iw_over_b']:.3f}" for v in out[name].values())
        print(f"  split costs {name} p={P}: (I+W)/B {got}", flush=True)
    return out


def rows(results: dict) -> list[tuple[str, str, str, str]]:
    """One row per configuration: (I + W) / B per stage and (F + I + W) / (F + B)."""
    out = []
    for name, stages in results.items():
        iw = [stages[s]["iw_over_b"] for s in sorted(stages)]
        whole = [stages[s]["microbatch_ratio"] for s in sorted(stages)]
        ms = [stages[s]["median_s"] for s in sorted(stages)]
        costs = "; ".join(
            f"stage {s}: F {m['F'] * 1e3:.2f}, B {m['B'] * 1e3:.2f} | F {m['Fs'] * 1e3:.2f}, I {m['I'] * 1e3:.2f}, "
            f"W {m['W'] * 1e3:.2f} ms"
            for s, m in enumerate(ms)
        )
        out.append(
            (
                f"split backward in one process, {name} p={P}, m=8's microbatch: (I + W) / B per stage, a storing stage "
                f"against 1F1B's, order alternated, median of {stages['0']['steps']} steps",
                f"{', '.join(f'{r:.3f}' for r in iw)} (whole microbatch, storing F included: "
                f"{', '.join(f'{r:.3f}' for r in whole)}; {costs})",
                "<= 1.10",
                "pass" if max(iw) <= 1.10 else "MISS",
            )
        )
    return out
