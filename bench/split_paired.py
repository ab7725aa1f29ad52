"""`make bench`'s paired split-backward rows (`bench/run.py --split-paired`): each zero-bubble
list of a configuration (ZB-H1, ZB-V, ZB-H1 with ``train.split_backward=drain``) step by step
beside 1F1B, one torchrun job each (bench/worker.py), where whole runs cannot settle it (a slow
spell of a VM moves a run's step by 30-50%): the two alternate step by step on pipelines built
from the same config and seed, each zero-bubble step held against the 1F1B step beside it; the
runtime alone and with ``ppx run``'s timers and memory counters, at p=2 and, given a core per
rank, p=4 (docs/benchmarks.md). The models and shapes are bench/split_backward.py's."""

from __future__ import annotations

import json
import os
import statistics
import time

from bench.split_backward import MODELS, SHAPE, M, matching

PAIRED_PS, PAIRED_REPS = (2, 4), 60
# the issue's own table (ZB-H1 41.6 against 1F1B's 34.0 ms when it was filed): the shipped
# experiment as it is (4 blocks, m=4, batch 16), its schedule swapped
AS_FILED = "llama-tiny as shipped (4 blocks)"
DRAIN = "zb_h1+train.split_backward=drain"  # ZB-H1 split only where a W fills the drain
H2_DRAIN = "zb_h2+train.split_backward=drain"  # ZB-H2 so: faster than 1F1B on both models in pooled jobs
PAIRED_KINDS, PAIRED_ZB = (
    ("ppx", "ppx_all"),
    ("zb_h1", "zbv", DRAIN, H2_DRAIN),
)  # the runtime alone, with ppx run's instruments


def check_paired(model: str, dtype: str, p: int, reps: int = PAIRED_REPS) -> dict:
    """Each zero-bubble variant of (``model``, ``dtype``) over ``p`` stages against 1F1B, one
    torchrun job per variant and observer set, the two alternating step by step: their median
    steps (1F1B's pooled over its jobs) and, per variant, the median over the ``reps`` pairs of
    its step over the 1F1B step beside it in its own job. (With all the variants in one job, a variant's place in the rotation moved its
    ratio by up to 3%: llama-tiny fp32 p=2's ZB-H1 0.994 or 1.032 by where it stood.)"""
    from bench.run import run_worker
    from ppx import config

    exp, overrides = _shape(model)
    overrides += [f"train.dtype={dtype}", f"pipeline.stages={p}"]
    cfg = config.load(exp, overrides)
    m, even = cfg.pipeline.microbatches, units_variant(cfg, p)
    ratios, medians, ones, pairs = {}, {}, {kind: [] for kind in PAIRED_KINDS}, 0
    for kind in PAIRED_KINDS:
        for name in PAIRED_ZB + ((even,) if even else ()):
            pair = [f"{kind}@1f1b", f"{kind}@{name}"]
            got = run_worker(p, pair, overrides, reps, f"split paired {model} {dtype} p={p} {name}", experiment=exp)
            steps = got["steps_s"]
            ratios[pair[1]] = statistics.median(a / b for a, b in zip(steps[pair[1]], steps[pair[0]]))
            medians[pair[1]] = got["median_step_s"][pair[1]]
            ones[kind] += steps[pair[0]]
            pairs = len(steps[pair[0]])
    medians.update({f"{kind}@1f1b": statistics.median(ones[kind]) for kind in PAIRED_KINDS})
    out = {"median_step_s": medians, "pairs": pairs, "ratio": ratios, "jobs": "one per variant", "m": m}
    out["machine"], out["date"] = _where(), time.strftime("%Y-%m-%d")
    print(f"  split paired {model} {dtype} p={p}: {json.dumps({k: round(r, 3) for k, r in ratios.items()})}")
    return out


PAIRED_CONFIGS = {
    f"{model} {dtype} p={p}": (model, dtype, p) for p in PAIRED_PS for model in MODELS for dtype in ("fp32", "bf16")
} | {f"{AS_FILED} fp32 p=2": (AS_FILED, "fp32", 2)}


def units_variant(cfg, p: int) -> str | None:
    """ZB-V split by units (``zbv+pipeline.balance=units``: ppx's default split before
    2026-11-29) where it differs from the default split, balanced by FLOPs, at ZB-V's 2p stages
    (``cfg``: the configuration's loaded config): llama, whose embedding and head are units of
    their own; the V puts both their stages on rank 0, and split by units its blocks are uneven
    (llama-tiny fp32 p=2: ZB-V 1.15-1.19x of 1F1B's step split by units, 1.00-1.09x over benches
    and runs with its blocks even, [3,2,2,3], the split the FLOPs give). None elsewhere."""
    from ppx import models
    from ppx.errors import UserError

    if cfg.pipeline.layers_per_stage is not None:
        return None
    try:
        ways = [models.stage_units(cfg.model, 2 * p, None, way) for way in ("units", "flops")]
    except UserError:  # fewer units than stages
        return None
    return "zbv+pipeline.balance=units" if ways[0] != ways[1] else None


def _shape(model: str) -> tuple[str, list[str]]:
    """(experiment, overrides) of a paired configuration's model: bench/split_backward.py's
    models at its shape, or the issue's experiment as shipped (its own m and batch)."""
    if model == AS_FILED:
        return "llama_tiny_1f1b_2cpu", []
    exp, *keys = MODELS[model]
    return exp, [*keys, *SHAPE]


def _where() -> str:
    """This machine (bench/tables.py's `this_machine`), and the CPUs the job had where it was
    given fewer than the machine has (``taskset``)."""
    from bench.tables import this_machine

    cpus, total = len(os.sched_getaffinity(0)), os.cpu_count()
    return this_machine() + (f", the job on {cpus} of its CPUs" if cpus != total else "")


def check_paired_all(only: str | None = None, cores: int | None = None) -> dict:
    """`check_paired` for every model, dtype and p, or those whose name holds ``only``. A
    configuration with more ranks than this machine has cores (``cores``, default its own) is
    not measured: ranks that share a core share its time, and no schedule gains from its bubble
    there (docs/benchmarks.md, "At p=4")."""
    cores = cores or len(os.sched_getaffinity(0))
    out = {}
    for name in matching(PAIRED_CONFIGS, only, "--split-paired"):
        model, dtype, p = PAIRED_CONFIGS[name]
        if p > cores:
            out[name] = {"skipped": f"needs a core per rank ({p}); this machine has {cores}"}
            print(f"  split paired {name}: skipped, {out[name]['skipped']}")
        else:
            out[name] = check_paired(model, dtype, p)
    return out


def _said(got: dict, kind: str) -> str:
    """A paired row's figures for one observer set: each zero-bubble step over 1F1B's."""
    r, ms = got["ratio"], got["median_step_s"]
    drain = f", ZB-H1 drain {r[f'{kind}@{DRAIN}']:.3f}x" if f"{kind}@{DRAIN}" in r else ""
    if f"{kind}@{H2_DRAIN}" in r:
        drain += f", ZB-H2 drain {r[f'{kind}@{H2_DRAIN}']:.3f}x"
    even = [k for k in r if k.startswith(f"{kind}@zbv+pipeline.layers_per_stage=")]
    if even:  # ZB-V with its blocks even, before they were so by default (results of 2026-11-28)
        split = even[0].split("=", 1)[1]
        drain += f", ZB-V blocks even {split} {r[even[0]]:.3f}x"
    if f"{kind}@zbv+pipeline.balance=units" in r:  # ZB-V split as before (`units_variant`)
        drain += f", ZB-V split by units {r[f'{kind}@zbv+pipeline.balance=units']:.3f}x"
    return (
        f"ZB-H1 {r[f'{kind}@zb_h1']:.3f}x, ZB-V {r[f'{kind}@zbv']:.3f}x{drain} (1F1B {ms[f'{kind}@1f1b'] * 1e3:.1f} ms)"
    )


def paired_rows(results: dict, machine: str) -> list[tuple[str, str, str, str]]:
    """One row per (model, dtype, p): each zero-bubble step over the 1F1B step beside it. A row
    measured on another machine than ``machine`` (the page's header) says where and when."""
    out = []
    for name, got in results.items():
        what = (
            f"split backward, steps side by side, {name}, m={got.get('m', M)}: each zero-bubble step over the 1F1B "
            "step beside it"
        )
        jobs = "in one job per variant, against 1F1B" if got.get("jobs") else "in one job"
        if got.get("machine") and not got["machine"].startswith(machine):
            what += f" (measured {got['date']} on {got['machine']})"
        if "skipped" in got:
            out.append((what, f"not measured: {got['skipped']}", "ZB-H1 < 1F1B", "skipped"))
            continue
        r = got["ratio"]
        alone, timed = _said(got, "ppx"), _said(got, "ppx_all")
        out.append(
            (
                f"{what}, median of {got['pairs']} pairs {jobs}",
                f"runtime alone: {alone}; with ppx run's timers and memory counters: {timed}",
                "ZB-H1 < 1F1B",
                "pass" if r["ppx@zb_h1"] < 1 and r["ppx_all@zb_h1"] < 1 else "MISS",
            )
        )
    return out
