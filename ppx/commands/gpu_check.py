"""`ppx gpu-check`: run every check the machine's GPUs allow and write gpu-check.md and
gpu-check.json into a new folder (docs/benchmarks.md, "On a GPU")."""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from ppx.errors import UserError

NO_GPU = "gpu-check: no CUDA device visible here, nothing checked (--dry-run lists its runs)"
DEFAULT_BUDGET_S = 540.0  # the runs' share of 10 minutes on one H100, the rest for the set-up and the report


def cmd_gpu_check(args) -> int:
    from ppx.gpucheck.orchestrate import NAMES
    from ppx.launch.devices import gpu_count

    only = _only(args.only, NAMES)
    if args.budget_s is not None and args.budget_s <= 0:
        raise UserError(f"--budget-s must be positive, got {args.budget_s:g}")
    if args.gpus is not None and not args.dry_run:
        raise UserError("--gpus is for --dry-run (a run uses the GPUs it finds)")
    if args.gpus is not None and args.gpus < 1:
        raise UserError(f"--gpus must be at least 1, got {args.gpus}")
    docs = Path(args.docs) if args.docs else None
    if docs is not None:  # (a dry run checks what the check would write to, too)
        from ppx.gpucheck.report import check_doc

        check_doc(docs)
    if args.out is not None:
        from ppx.commands.common import not_a_dangling_link, not_in_a_run

        not_a_dangling_link("--out", args.out)
        if Path(args.out).exists():
            raise UserError(f"--out {args.out} already exists (a check never overwrites one)")
        not_in_a_run("--out", args.out)
    if args.dry_run:
        return _dry_run(args.gpus if args.gpus is not None else max(gpu_count(), 1), only)
    gpus = 0 if args.on_cpu else gpu_count()
    if gpus == 0 and not args.on_cpu:  # a check that checked nothing must not read as a pass
        raise UserError(NO_GPU)
    out = _new_folder(args.out)
    return _check(out, gpus, args.on_cpu, args.budget_s or DEFAULT_BUDGET_S, only, docs)


def _check(out: Path, gpus: int, on_cpu: bool, budget_s: float, only, docs: Path | None) -> int:
    import os

    from ppx.gpucheck import machine, report
    from ppx.gpucheck.orchestrate import run_checks

    m = machine.Machine("cpu" if on_cpu else "cuda", gpus, small=on_cpu)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")  # names its rows in the docs block
    start = time.monotonic()
    facts = machine.facts(m)
    print(f"ppx gpu-check: {machine.describe(facts)}", flush=True)
    results = run_checks(out, m, budget_s, only, echo=lambda line: print(line, flush=True))
    facts["load_after_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    report.write(out, facts, results, date, time.monotonic() - start, budget_s)
    if docs is not None:
        report.update_doc(docs, facts, results, date, out)
        print(f"ppx gpu-check: the table and its date are in {docs}")
    c = report.counts(results)
    print(f"ppx gpu-check: {c['PASS']} PASS, {c['FAIL']} FAIL, {c['SKIPPED']} SKIPPED; report: {out / 'gpu-check.md'}")
    return 1 if c["FAIL"] else 0


def _only(text: str | None, names: tuple[str, ...]) -> tuple[str, ...]:
    if not text:
        return names
    picked = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in picked if x not in names]
    if unknown or not picked:
        raise UserError(f"--only {text}: choose from {', '.join(names)}")
    return picked


def _new_folder(given: str | None) -> Path:
    """A folder that did not exist: --out as given, or gpu-checks/<UTC time> (-2, -3, ...)."""
    if given is not None:
        out = Path(given)
        if out.exists():
            raise UserError(f"--out {given} already exists (a check never overwrites one)")
        try:
            out.mkdir(parents=True)
        except OSError as e:
            raise UserError(f"--out {given}: {e.strerror}") from None
        return out
    base = Path("gpu-checks") / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    for k in range(1, 100):
        out = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            out.mkdir(parents=True)
            return out
        except FileExistsError:
            continue
    raise UserError(f"{base}: could not find a new folder name")


def _dry_run(gpus: int, only) -> int:
    """The runs each check would make on ``gpus`` GPUs, their estimates, each config checked."""
    from ppx.gpucheck.machine import Machine
    from ppx.gpucheck.orchestrate import plans
    from ppx.gpucheck.runs import Runner

    m = Machine("cuda", gpus)
    total, bad = 0.0, 0
    first: dict[str, str] = {}  # run name -> the check that makes it (a later check reads it too)
    with tempfile.TemporaryDirectory() as tmp:
        runner = Runner(Path(tmp), m, deadline=0.0)
        for check, specs in plans(m, only):
            if isinstance(specs, str):
                print(f"{check.NAME}: skipped: {specs}")
                continue
            own = [s for s in specs if s.name not in first]
            secs = sum(s.estimate_s for s in own)
            total += secs
            shared = f" (and {len(specs) - len(own)} of earlier checks')" if len(own) < len(specs) else ""
            print(f"{check.NAME}: {len(own)} run{'s' if len(own) != 1 else ''}, about {secs:.0f} s{shared}")
            for s in specs:
                if s.name in first:
                    print(f"  {s.name}: {first[s.name]}'s run")
                    continue
                first[s.name] = check.NAME
                error = runner.check(s)
                bad += error is not None
                state = f"  REFUSED: {error}" if error else ""
                print(
                    f"  {s.name}: {s.processes} process{'es' if s.processes > 1 else ''}, about {s.estimate_s:.0f} s{state}"
                )
    print(
        f"total: about {total:.0f} s of runs on {gpus} GPU{'s' if gpus != 1 else ''} (budget {DEFAULT_BUDGET_S:.0f} s)"
    )
    if bad:
        print(f"ppx gpu-check: {bad} run config(s) refused", file=sys.stderr)
    return 1 if bad else 0
