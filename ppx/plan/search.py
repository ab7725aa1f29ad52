"""Every candidate evaluated, over a process pool, and ranked: those that fit the budget by
throughput (fastest first; ties: less memory), then those that do not."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from functools import partial

from ppx.plan.evaluate import Result, evaluate
from ppx.plan.inputs import PlanInputs
from ppx.plan.space import Candidate, Skipped


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a SLURM job's or taskset's share, not
    the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_jobs() -> int:
    """min(2, the CPUs this process may use)."""
    return min(2, usable_cpus())


def rank(results: list[Result]) -> list[Result]:
    """Fitting first, by throughput descending, then by peak memory; then the rest likewise."""
    return sorted(results, key=lambda r: (not r.fits, -float(f"{r.throughput:.9g}"), r.peak_max, r.label()))


# the plan's steps came out 0.0-1.9% short of the measured ones in `make bench`, which
# candidate furthest moving from bench to bench: closer than this, it does not order two
CLOSE_PCT = 2.0


def near_best(results: list[Result], pct: float = CLOSE_PCT) -> list[Result]:
    """The fitting candidates after the best (ranked ``results``) whose predicted throughput is
    within ``pct`` % of the best's: too close for a prediction to tell apart."""
    fitting = [r for r in results if r.fits]
    if not fitting:
        return []
    floor = fitting[0].throughput / (1 + pct / 100)
    return [r for r in fitting[1:] if r.throughput >= floor]


def search(
    cands: list[Candidate], inputs: PlanInputs, jobs: int | None = None, done=None
) -> tuple[list[Result], list[Skipped]]:
    """Evaluate ``cands`` on ``jobs`` processes (one: in this one); (ranked results, skipped).
    ``done``: called with each candidate once it is evaluated (and those before it), in order."""
    jobs = default_jobs() if jobs is None else jobs
    one = partial(evaluate, inputs=inputs)
    got = []
    with ProcessPoolExecutor(jobs) if jobs > 1 and len(cands) > 1 else nullcontext() as pool:
        each = pool.map(one, cands, chunksize=max(1, len(cands) // (4 * jobs))) if pool else map(one, cands)
        for c, g in zip(cands, each):
            got.append(g)
            if done:
                done(c)
    results = [g for g in got if isinstance(g, Result)]
    return rank(results), [g for g in got if isinstance(g, Skipped)]
