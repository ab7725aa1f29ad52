"""Every check in turn: its runs (each config checked before any run starts), then its
verdicts from what the runs recorded.

A check is a module with ``NAME``, ``TITLE``, ``CRITERIA`` ([(what, threshold)]), ``plan(machine)``
(its `RunSpec`s, or the reason it cannot run on this machine) and ``judge(machine, runs)``
(an `Outcome` from the run directories). ``runs[name]`` is the run's `RunDir`; a run that
failed or was not started raises `Missing`, which turns the check's rows into FAIL (or
SKIPPED, when the time budget stopped it)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ppx.gpucheck import memory, nccl, overlap, precision, profiler, saved, split, throughput, timers
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import Missing, Runner, RunResult, Runs, RunSpec
from ppx.gpucheck.verdict import Outcome, failed, skipped

CHECKS = (timers, memory, saved, profiler, precision, overlap, nccl, throughput, split)  # split reads throughput's runs
NAMES = tuple(c.NAME for c in CHECKS)


@dataclass
class CheckResult:
    name: str
    title: str
    outcome: Outcome
    runs: list[RunResult]
    seconds: float


def plans(machine: Machine, only: tuple[str, ...] = NAMES) -> list[tuple[object, list[RunSpec] | str]]:
    return [(c, c.plan(machine)) for c in CHECKS if c.NAME in only]


def run_checks(
    out: Path, machine: Machine, budget_s: float, only: tuple[str, ...] = NAMES, echo: Callable[[str], None] = print
) -> list[CheckResult]:
    deadline = time.monotonic() + budget_s
    runner = Runner(out, machine, deadline, echo)
    planned = plans(machine, only)
    invalid = {}
    for check, specs in planned:  # every run's config, before the first run
        if not isinstance(specs, str):
            errors = [e for e in map(runner.check, specs) if e]
            if errors:
                invalid[check.NAME] = "; ".join(errors)
    total = len({spec.name for _, s in planned if not isinstance(s, str) for spec in s})  # a shared run once
    echo(f"ppx gpu-check: {machine.where}; {len(planned)} checks, {total} runs, budget {budget_s:.0f} s; folder {out}")
    results = []
    for check, specs in planned:
        start = time.monotonic()
        if isinstance(specs, str):
            outcome, ran = Outcome([skipped(w, specs, t) for w, t in check.CRITERIA]), []
        elif check.NAME in invalid:
            why = f"a run's config was refused: {invalid[check.NAME]}"
            outcome, ran = Outcome([failed(w, why, t) for w, t in check.CRITERIA]), []
        else:
            ran = [runner.run(s) for s in specs]
            outcome = _judge(check, machine, Runs(runner))
        results.append(CheckResult(check.NAME, check.TITLE, outcome, ran, time.monotonic() - start))
        verdicts = ", ".join(f"{r.verdict}" for r in outcome.rows)
        echo(f"ppx gpu-check: {check.NAME}: {outcome.verdict} ({verdicts})")
    return results


def _judge(check, machine: Machine, runs: Runs) -> Outcome:
    try:
        return check.judge(machine, runs)
    except Missing as e:
        r = e.result
        if r.budget:
            return Outcome([skipped(w, f"run {r.spec.name} not started ({r.why})", t) for w, t in check.CRITERIA])
        return Outcome([failed(w, f"run {r.spec.name} failed: {r.why}", t) for w, t in check.CRITERIA])
    except Exception as e:  # a check's arithmetic met figures it did not expect: say so, judge the rest
        why = f"the check could not read its runs' figures: {type(e).__name__}: {e}"
        return Outcome([failed(w, why, t) for w, t in check.CRITERIA], data={"traceback": traceback.format_exc()})
