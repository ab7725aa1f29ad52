"""Sizes and counts written for people: the unit a byte count reads best in (pictures, tables,
plans), a count with its noun."""

from __future__ import annotations


def byte_unit(n: float) -> tuple[str, int]:
    """The unit to show ``n`` bytes in, and its size."""
    for i, unit in enumerate(("B", "KiB", "MiB", "GiB")):
        if n < 1024 ** (i + 1):
            return unit, 1024**i
    return "TiB", 1024**4


def size(n: float) -> str:
    """'64.0 MiB': ``n`` bytes in the unit it reads best in, to a tenth."""
    unit, scale = byte_unit(abs(n))
    return f"{n:.0f} B" if unit == "B" else f"{n / scale:.1f} {unit}"


def count(n: int, noun: str) -> str:
    """'1 stage', '2 stages': ``n`` and ``noun``, plural but for one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def stage_list(indices) -> str:
    """'stage 0', 'stages 0, 2': a non-empty list of stage indices with its noun."""
    return ("stage " if len(indices) == 1 else "stages ") + ", ".join(map(str, indices))
