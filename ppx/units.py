"""Sizes written for people: the unit a byte count reads best in (pictures, tables, plans)."""

from __future__ import annotations


def byte_unit(n: float) -> tuple[str, int]:
    """The unit to show ``n`` bytes in, and its size."""
    for i, unit in enumerate(("B", "KiB", "MiB", "GiB")):
        if n < 1024 ** (i + 1):
            return unit, 1024**i
    return "TiB", 1024**4
