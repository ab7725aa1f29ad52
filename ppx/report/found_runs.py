"""The runs a comparison's paths and globs name (``ppx compare``'s arguments): completed runs,
every run below a folder, and those that did not complete left out, by name."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from ppx.errors import UserError
from ppx.report.run_dir import RunDir, completed, is_run_folder


def find_runs(patterns: list[str], left_out: list[Path] | None = None) -> list[RunDir]:
    """Completed run directories (`completed`) named by paths or globs (a folder: every run below
    it; a path, not a glob, that is neither run nor folder of runs is refused). Runs that did not
    complete (incomplete.txt, or `is_run_folder`) are left out, named on stderr and in ``left_out``."""
    found: list[Path] = []
    left: list[Path] = []
    for pat in patterns:
        matches = sorted(glob.glob(pat))
        if not matches:
            raise UserError(f"no run matches {pat!r}")
        for m in map(Path, matches):
            if (m / "summary.json").exists():  # (beside incomplete.txt: it failed after writing it)
                (found if completed(m) else left).append(m)
                continue
            done, begun = _runs_below(m) if m.is_dir() else ([], [])
            # (docs, README.md: named, not passed over; runs/compare, comparisons of ppx's, a shell's runs/* names)
            if not (done or begun or glob.has_magic(pat) or _comparisons_below(m)):
                raise UserError(f"{pat} is neither a run (a folder with summary.json) nor a folder of runs")
            found += done
            left += begun
    unique, left = list(dict.fromkeys(found)), list(dict.fromkeys(left))
    names = ", ".join(map(str, left[:3])) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    if not unique:
        failed = f" ({len(left)} that did not complete: {names})" if left else ""
        raise UserError(f"no completed run (summary.json) under {' '.join(patterns)}{failed}")
    if left:
        print(f"ppx compare: left out {len(left)} run(s) that did not complete: {names}", file=sys.stderr)
    if left_out is not None:
        left_out += left
    return [RunDir(p) for p in unique]


def _comparisons_below(path: Path) -> bool:
    """Whether folder ``path`` holds a comparison of ppx's (compare.json): runs/compare."""
    return path.is_dir() and any("compare.json" in files for _, _, files in os.walk(path))


def _runs_below(folder: Path) -> tuple[list[Path], list[Path]]:
    """One walk of ``folder``: the runs below it that completed (summary.json), in the order
    they finished (a sweep's order), and those begun that did not (incomplete.txt, or
    `is_run_folder` without a summary.json), by path."""
    done: list[Path] = []
    begun: list[Path] = []
    for root, _, files in os.walk(folder):
        here = Path(root)
        if "summary.json" in files and "incomplete.txt" not in files:
            done.append(here)
        elif "incomplete.txt" in files or ("config.yaml" in files and is_run_folder(here)):
            begun.append(here)
    return sorted(done, key=lambda d: (d / "summary.json").stat().st_mtime), sorted(begun)
