"""gpu-check.md and gpu-check.json: the machine, then per check its rows (figure, threshold,
verdict), its details and its runs; and the table block docs/benchmarks.md keeps."""

from __future__ import annotations

import json
import re
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
        f"- took {elapsed_s:.0f} s of a {budget_s:.0f} s budget, {len({r.spec.name for r in runs if r.wall_s is not None})} runs",
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
    """Put this report's rows into the block between the markers, keeping the rows of the
    checks it did not run (``--only``) or could not judge at all (every row SKIPPED: the time
    budget, too few GPUs) from the report that last did, so that partial runs add up to one
    table. Each row names its report's date; the block lists those reports, newest first."""
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    old_block, tail = rest.split(END, 1)
    old_rows, old_reports = _read_block(old_block)
    rows = {}  # check -> its table lines
    ran = []
    for res in results:
        judged_here = any(r.verdict != SKIPPED for r in res.outcome.rows)
        if not judged_here and res.name in old_rows and not old_rows[res.name][1]:
            continue  # the earlier report judged it: keep that
        cells = ((res.name, r.what, r.figure, r.threshold, f"**{r.verdict}**", date) for r in res.outcome.rows)
        rows[res.name] = table(COLUMNS, list(map(list, cells)))[2:]
        ran.append(res.name)
    for name, (lines, _) in old_rows.items():
        rows.setdefault(name, lines)
    c, git = counts(results), facts.get("ppx_git") or {}
    commit = f"ppx {(git.get('commit') or '-')[:7]}{' (uncommitted changes)' if git.get('dirty') else ''}"
    reports = {
        date: f"- {date}: {', '.join(ran) or 'no check'}; {describe(facts)}; {commit}; {c[PASS]} PASS, {c[FAIL]} FAIL, "
        f"{c[SKIPPED]} SKIPPED (`ppx gpu-check`, its folder {report.name})"
    }
    for when, line in old_reports.items():
        reports.setdefault(when, line)
    used = {line.rsplit(" | ", 1)[1].rstrip(" |") for lines in rows.values() for line in lines}
    block = [
        BEGIN,
        "Reports, newest first; each row comes from the newest report that judged its check (`--only` and the time",
        "budget leave the other checks' rows as they were):",
        "",
        *[reports[d] for d in sorted(reports, reverse=True) if d in used],
        "",
        *table(COLUMNS, [])[:2],
        *[line for name in _ordered(rows) for line in rows[name]],
        END,
    ]
    path.write_text(head + "\n".join(block) + tail)


COLUMNS = ["check", "what", "figure", "threshold", "verdict", "report"]
_REPORT = re.compile(r"^- (\d{4}-\d\d-\d\d \d\d:\d\d UTC): ")


def _read_block(block: str) -> tuple[dict[str, tuple[list[str], bool]], dict[str, str]]:
    """The block's table lines per check (with whether every one is SKIPPED) and its report
    lines per date. Rows without a report column (an older block) are not kept."""
    rows: dict[str, tuple[list[str], bool]] = {}
    reports = {}
    for line in block.splitlines():
        if m := _REPORT.match(line):
            reports[m.group(1)] = line
            continue
        cells = line.strip().strip("|").split(" | ")
        if not line.startswith("| ") or len(cells) != len(COLUMNS) or cells[0].strip() in ("check", "---"):
            continue
        name = cells[0].strip()
        lines, skipped_all = rows.get(name, ([], True))
        rows[name] = (lines + [line], skipped_all and SKIPPED in cells[4])
    return rows, reports


def _ordered(rows: dict) -> list[str]:
    from ppx.gpucheck.orchestrate import NAMES

    return sorted(rows, key=lambda n: (NAMES.index(n) if n in NAMES else len(NAMES), n))
