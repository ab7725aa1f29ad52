"""gpu-check.md and gpu-check.json: the machine, then per check its rows (figure, threshold,
verdict), its details and its runs; and the table block docs/benchmarks.md keeps."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from ppx.errors import UserError
from ppx.files import write_whole
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
    write_whole(out / "gpu-check.md", "\n".join(lines) + "\n")
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
    write_whole(out / "gpu-check.json", json.dumps(data, indent=2, default=str) + "\n")


def check_doc(path: Path) -> None:
    """Fail before any work when ``path`` cannot take the table (no such file, no markers)."""
    if not path.is_file():
        raise UserError(f"--docs {path}: no such file")
    text = path.read_text()
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise UserError(f"--docs {path}: no {BEGIN} ... {END} block to hold the table")


def update_doc(path: Path, facts: dict, results, date: str, report: Path) -> None:
    """Put this report's rows into the block between the markers, row by row: a row it judged
    replaces the block's row of the same check and figure; a row it could only skip (the time
    budget, too few GPUs) keeps a judged one from an earlier report; the checks it did not run
    (``--only``) keep theirs. So partial runs add up to one table. Each row names its report
    (its date); the block lists the reports that still own a row, newest first."""
    from ppx.gpucheck.orchestrate import NAMES

    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    old_block, tail = rest.split(END, 1)
    old, old_reports = _read_block(old_block)
    rows: dict[str, list[tuple[str, str]]] = {}  # check -> [(its report's date, table line)]
    ran = []
    for res in results:
        mine = []
        for r in res.outcome.rows:
            earlier = old.get((res.name, r.what))
            if r.verdict == SKIPPED and earlier is not None and earlier[2] != SKIPPED:
                mine.append(earlier[:2])  # the earlier report judged it: keep that
            else:
                cells = [res.name, r.what, r.figure, r.threshold, f"**{r.verdict}**", date]
                mine.append((date, table(COLUMNS, [cells])[2]))
        rows[res.name] = mine
        if any(when == date for when, _ in mine):
            ran.append(res.name)
    judged_here = set(rows)
    for (name, _), (when, line, _) in old.items():  # checks this report did not run (every row), if ppx still has them
        if name in NAMES and name not in judged_here:
            rows.setdefault(name, []).append((when, line))
    c, git = counts(results), facts.get("ppx_git") or {}
    commit = f"ppx {(git.get('commit') or '-')[:7]}{' (uncommitted changes)' if git.get('dirty') else ''}"
    reports = {
        date: f"- {date}: {', '.join(ran)}; {describe(facts)}; {commit}; the report's verdicts {c[PASS]} PASS, "
        f"{c[FAIL]} FAIL, {c[SKIPPED]} SKIPPED (`ppx gpu-check`, its folder {report.name})",
        **{when: line for when, line in old_reports.items() if when != date},
    }
    used = {when for lines in rows.values() for when, _ in lines}
    order = sorted(rows, key=lambda n: NAMES.index(n) if n in NAMES else len(NAMES))
    block = [
        BEGIN,
        "Reports, newest first. Each row comes from the newest report that judged it: a row a report could only",
        "skip keeps an earlier verdict, and the checks a report did not run (`--only`) keep their rows.",
        "",
        *[reports[d] for d in sorted(reports, reverse=True) if d in used],
        "",
        *table(COLUMNS, [])[:2],
        *[line for name in order for _, line in rows[name]],
        END,
    ]
    write_whole(path.resolve(), head + "\n".join(block) + tail)  # (a full disk truncated the doc; a link stays one)


COLUMNS = ["check", "what", "figure", "threshold", "verdict", "report"]
_REPORT = re.compile(r"^- (\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)? UTC): ")
_CELL = re.compile(r"(?<!\\)\|")  # a cell border: a | that table() did not escape


def _read_block(block: str) -> tuple[dict[tuple[str, str], tuple[str, str, str]], dict[str, str]]:
    """The block's rows by (check, what) as (report date, table line, verdict), and its report
    lines by date. Rows without a report column (an older block) are not kept."""
    rows, reports = {}, {}
    for line in block.splitlines():
        if m := _REPORT.match(line):
            reports[m.group(1)] = line
            continue
        cells = [c.strip() for c in _CELL.split(line.strip())[1:-1]]
        if not line.startswith("| ") or len(cells) != len(COLUMNS) or cells[0] in ("check", "---"):
            continue
        rows[(cells[0], cells[1])] = (cells[5], line, cells[4].strip("*"))
    return rows, reports
