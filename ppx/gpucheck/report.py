"""gpu-check.md and gpu-check.json: the machine, then per check its rows (figure, threshold,
verdict), its details and its runs; and the table block docs/benchmarks.md keeps."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ppx.errors import UserError
from ppx.gpucheck.machine import describe
from ppx.gpucheck.verdict import FAIL, PASS, SKIPPED, table

BEGIN, END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"


def counts(results) -> dict[str, int]:
    c = Counter(r.verdict for res in results for r in res.outcome.rows)
    return {v: c.get(v, 0) for v in (PASS, FAIL, SKIPPED)}


def rows_table(results) -> list[str]:
    return table(
        ["check", "what", "figure", "threshold", "verdict"],
        [[res.name, r.what, r.figure, r.threshold, f"**{r.verdict}**"] for res in results for r in res.outcome.rows],
    )


def headline(facts: dict, date: str) -> str:
    return f"{date}, {describe(facts)}"


def write(out: Path, facts: dict, results, date: str, elapsed_s: float, budget_s: float) -> None:
    c = counts(results)
    runs = [r for res in results for r in res.runs]
    git = facts.get("ppx_git") or {}
    commit = (git.get("commit") or "-")[:12] + (" (uncommitted changes)" if git.get("dirty") else "")
    load = "/".join(map(str, facts["load_1_5_15"]))
    after = "/".join(map(str, facts.get("load_after_1_5_15", [])))
    lines = [
        "# ppx gpu-check",
        "",
        f"- date: {date}",
        f"- machine: {describe(facts)}",
        f"- host: {facts['hostname']}, {facts['cpus']} CPUs, {facts['platform']}; load (1/5/15 min) {load} before, {after} after",
        f"- ppx: commit {commit}",
        f"- took {elapsed_s:.0f} s of a {budget_s:.0f} s budget, {sum(r.wall_s is not None for r in runs)} runs",
        f"- verdicts: {c[PASS]} PASS, {c[FAIL]} FAIL, {c[SKIPPED]} SKIPPED",
        "",
        *rows_table(results),
    ]
    for res in results:
        lines += ["", f"## {res.name}: {res.title} ({res.outcome.verdict}, {res.seconds:.0f} s)", ""]
        if res.outcome.details:
            lines += [*res.outcome.details, ""]
        for r in res.runs:
            state = "ok" if r.dir else r.why
            took = "" if r.wall_s is None else f", {r.wall_s:.1f} s"
            lines.append(f"- `{r.command}`{took}: {state}")
    (out / "gpu-check.md").write_text("\n".join(lines) + "\n")
    data = {
        "date": date,
        "machine": facts,
        "elapsed_s": round(elapsed_s, 1),
        "budget_s": budget_s,
        "verdicts": c,
        "checks": [
            {
                "check": res.name,
                "title": res.title,
                "verdict": res.outcome.verdict,
                "seconds": round(res.seconds, 1),
                "rows": [r.as_dict() for r in res.outcome.rows],
                "data": res.outcome.data,
                "runs": [r.as_dict() for r in res.runs],
            }
            for res in results
        ],
    }
    (out / "gpu-check.json").write_text(json.dumps(data, indent=2, default=str) + "\n")


def check_doc(path: Path) -> None:
    """Fail before any work when ``path`` cannot take the table (no such file, no markers)."""
    if not path.is_file():
        raise UserError(f"--docs {path}: no such file")
    text = path.read_text()
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise UserError(f"--docs {path}: no {BEGIN} ... {END} block to hold the table")


def update_doc(path: Path, facts: dict, results, date: str, report: Path) -> None:
    """Replace the block between the markers with this report's headline and table."""
    text = path.read_text()
    c = counts(results)
    block = [
        BEGIN,
        f"Latest report: {headline(facts, date)}; {c[PASS]} PASS, {c[FAIL]} FAIL, {c[SKIPPED]} SKIPPED "
        f"(`ppx gpu-check`, its folder {report.name}).",
        "",
        *rows_table(results),
        END,
    ]
    head, rest = text.split(BEGIN, 1)
    path.write_text(head + "\n".join(block) + rest.split(END, 1)[1])
