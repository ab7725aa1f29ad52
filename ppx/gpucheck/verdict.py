"""What a check says: rows of (figure, threshold, verdict), and the check's details.

A row is one thing held against one threshold: PASS or FAIL from the recorded figures, or
SKIPPED with the reason it could not be judged here. A check's verdict is FAIL when any row
fails, PASS when every judged row passes, SKIPPED when none could be judged."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, FAIL, SKIPPED = "PASS", "FAIL", "SKIPPED"


@dataclass(frozen=True)
class Row:
    """``what`` was measured, ``figure`` is what came out (text), ``value`` the number the
    verdict rests on (None when skipped), ``threshold`` what it must meet (text)."""

    what: str
    figure: str
    threshold: str
    verdict: str
    value: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def judged(what: str, value: float, ok: bool, figure: str, threshold: str) -> Row:
    return Row(what, figure, threshold, PASS if ok else FAIL, value)


def skipped(what: str, why: str, threshold: str) -> Row:
    return Row(what, f"skipped: {why}", threshold, SKIPPED)


def failed(what: str, why: str, threshold: str) -> Row:
    """A row that could not be measured because something broke (a run that failed)."""
    return Row(what, why, threshold, FAIL)


@dataclass
class Outcome:
    """A check's rows and its details: markdown lines (tables per rank, schedule or cell)
    and the same facts as data for gpu-check.json."""

    rows: list[Row]
    details: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return overall(self.rows)


def overall(rows: list[Row]) -> str:
    verdicts = {r.verdict for r in rows}
    if FAIL in verdicts:
        return FAIL
    return PASS if PASS in verdicts else SKIPPED


def pct(x: float) -> str:
    """+1.23% style."""
    return f"{x:+.2%}"


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table as lines (a cell's | escaped, its line breaks made spaces: a failed
    run's message can hold either)."""
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"
