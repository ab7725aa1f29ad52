"""Sizes and counts written for people: the unit a byte count reads best in (pictures, tables,
plans), a count with its noun."""

from __future__ import annotations


def byte_unit(n: float) -> tuple[str, int]:
    """The unit to show ``n`` bytes in, and its size."""
    for i, unit in enumerate(("B", "KiB", "MiB", "GiB")):
        if n < 1024 ** (i + 1):
            return unit, 1024**i
    return "TiB", 1024**4


def format_bytes(n: float) -> str:
    """'512.0 MiB', '1.50 GiB', '64.0 KiB', '12 B': ``n`` bytes in the unit `byte_unit` picks."""
    unit, scale = byte_unit(abs(n))
    if unit == "B":
        return f"{n:.0f} B"
    return f"{n / scale:.{2 if unit in ('GiB', 'TiB') else 1}f} {unit}"


def count(n: int, noun: str) -> str:
    """'1 stage', '2 stages': ``n`` and ``noun``, plural but for one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def stage_list(indices) -> str:
    """'stage 0', 'stages 0, 2': a non-empty list of stage indices with its noun."""
    return ("stage " if len(indices) == 1 else "stages ") + ", ".join(map(str, indices))
