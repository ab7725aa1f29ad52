"""``bench/run.py --FLAG ...``: one part of `make bench` measured again, the other results of
bench/results.json kept, and docs/benchmarks.md regenerated (`rerun_from_args`)."""

from __future__ import annotations

import json
import os
import time

from bench.run import CASES, ROOT, RUNS, run_case, run_summary
from bench.tables import markdown, write_generated

RESULTS = ROOT / "bench" / "results.json"


def rerun(prefixes: list[str]) -> None:
    """``bench/run.py --runs PREFIX ...``: run again only the whole runs whose names start with
    a prefix, keep the other results of bench/results.json, and regenerate docs/benchmarks.md."""
    results = json.loads(RESULTS.read_text())
    names = [n for n in RUNS if any(n.startswith(p) for p in prefixes)]
    if not names:
        raise SystemExit(f"no run starts with {' or '.join(prefixes)}; runs: {', '.join(RUNS)}")
    print(f"ppx bench: {len(names)} runs again")
    results.setdefault("runs", {}).update({name: run_summary(name) for name in names})
    results["rerun"] = {"date": time.strftime("%Y-%m-%d"), "runs": names}
    _save(results)


def rerun_cases(names: list[str], scale: float) -> None:
    """``bench/run.py --cases NAME ...``: run again only these cases (`CASES`), keep the other
    results of bench/results.json, and regenerate docs/benchmarks.md."""
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        raise SystemExit(
            f"bench/run.py --cases: no case {', '.join(unknown) or '(none given)'}; cases: {', '.join(CASES)}"
        )

    got = {name: run_case(name, scale) for name in names}
    results = json.loads(RESULTS.read_text())  # read after the measuring: a change meanwhile is kept
    results.update(got)
    results["cases_rerun"] = {"date": time.strftime("%Y-%m-%d"), "cases": names}
    _save(results)


def rerun_plans() -> None:
    """``bench/run.py --plans``: the planner rows again (bench/plan_check.py), the other results kept."""
    from bench.plan_check import check_all

    _rerun_rows("plans", lambda: check_all(ROOT / "docs" / "images"))


def rerun_split(only: str | None = None) -> None:
    """``bench/run.py --split [TEXT]``: the split-backward rows again (bench/split_backward.py),
    the other results kept; with TEXT, only the configurations whose name holds it (``"fp32
    p=2"``: both models' fp32 rows at p=2), the others' rows kept."""
    from bench.split_backward import check_all

    _rerun_rows("split_backward", lambda: check_all(only), keep_others=only is not None)


def rerun_split_large() -> None:
    """``bench/run.py --split-large``: the split-backward rows where matmuls dominate again
    (bench/split_backward.py's `check_large`), the other results kept."""
    from bench.split_backward import check_large

    _rerun_rows("split_large", check_large)


def rerun_split_paired(only: str | None = None) -> None:
    """``bench/run.py --split-paired [TEXT]``: ZB-H1, ZB-V, ZB-H1 and ZB-H2 drained each step by step
    beside 1F1B, a job each (bench/split_paired.py's `check_paired`), for every model, dtype and p or those whose
    name holds TEXT; the other results kept."""
    from bench.split_paired import check_paired_all

    _rerun_rows("split_paired", lambda: check_paired_all(only), keep_others=only is not None)


def rerun_split_costs(only: str | None = None) -> None:
    """``bench/run.py --split-costs [TEXT]``: (I + W) / B in one process (bench/split_costs.py)
    for every configuration or those whose name holds TEXT; the other results kept."""
    from bench.split_costs import check_all

    _rerun_rows("split_costs", lambda: check_all(only), keep_others=only is not None)


def rerun_printed() -> None:
    """``bench/run.py --printed``: issue 25's rows again (bench/plan_printed.py: plans run as
    printed, zb_auto against the paper's table), the other results kept."""
    from bench.plan_printed import check_all

    _rerun_rows("printed_plans", check_all)


def _rerun_rows(key: str, measure, keep_others: bool = False) -> None:
    """``results[key]`` measured again by ``measure()`` (with its date), the other results kept
    (``keep_others``: the configurations of ``results[key]`` that ``measure`` left out too);
    bench/results.json and docs/benchmarks.md rewritten. The file is read after the measuring,
    so a change to it meanwhile (a merge) is kept."""
    rows = measure()
    results = json.loads(RESULTS.read_text())
    results[key] = {**results.get(key, {}), **rows} if keep_others else rows
    results[f"{key}_measured_on"] = time.strftime("%Y-%m-%d")
    _save(results)


def _save(results: dict) -> None:
    """bench/results.json and the generated part of docs/benchmarks.md from ``results``."""
    results.setdefault("measured_on", "2026-11-23")  # the last full `make bench` before dates were kept
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    md = markdown(results, float(os.environ.get("BENCH_SCALE", "1")))
    write_generated(ROOT / "docs" / "benchmarks.md", md)
    print(md)


FLAGS = {  # flag -> what it reruns, given the arguments after it and BENCH_SCALE
    "--runs": lambda args, scale: rerun(args),
    "--cases": rerun_cases,
    "--plans": lambda args, scale: rerun_plans(),
    "--split": lambda args, scale: rerun_split(args[0] if args else None),
    "--split-large": lambda args, scale: rerun_split_large(),
    "--split-paired": lambda args, scale: rerun_split_paired(args[0] if args else None),
    "--split-costs": lambda args, scale: rerun_split_costs(args[0] if args else None),
    "--printed": lambda args, scale: rerun_printed(),
}


def rerun_from_args(argv: list[str]) -> None:
    """``argv``: a flag of `FLAGS` and its arguments."""
    flag, *args = argv
    if flag not in FLAGS:
        raise SystemExit(f"bench/run.py: no option {flag}; options: {', '.join(FLAGS)}, or case names")
    FLAGS[flag](args, float(os.environ.get("BENCH_SCALE", "1")))
