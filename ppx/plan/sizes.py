"""Byte sizes on the command line: '40GiB', '512MiB', '1.5e9', '64KB' -> bytes, and back."""

from __future__ import annotations

import math
import re

from ppx.errors import UserError

UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(option: str, text: str) -> float:
    """Bytes from '40GiB', '512MiB', '1.5e9', '64KB' (KB/MB/GB powers of 10, KiB/MiB/GiB of 2);
    a malformed or negative size is a one-line UserError naming ``option``."""
    got = _SIZE.match(str(text))
    unit = got.group(2).upper() if got else None
    if got is None or unit not in UNITS:
        raise UserError(f"{option} {text!r}: give a size in bytes, e.g. 40GiB, 512MiB, 64KB or 1.5e9")
    value = float(got.group(1)) * UNITS[unit]
    if not math.isfinite(value):
        raise UserError(f"{option} {text!r}: the size must be finite")
    return value


def parse_sizes(option: str, text: str) -> list[float]:
    """Bytes from one size or a comma-separated list of them ('1GiB,2GiB')."""
    parts = str(text).split(",")
    if any(not p.strip() for p in parts):
        raise UserError(f"{option} {text!r}: an empty entry in the list")
    return [parse_size(option, p) for p in parts]


def parse_budget(option: str, text: str | None) -> float | None:
    """A memory budget per rank from one size (None: none). A bare number under 1 KiB is refused:
    a size without a unit is bytes, and ``--mem-budget 40`` is 40GiB with its unit left out."""
    if text is None:
        return None
    values = parse_sizes(option, text)
    if len(values) != 1:
        raise UserError(f"{option} {text}: give one size per rank (e.g. 40GiB)")
    if values[0] < 2**10 and not _SIZE.match(text).group(2):
        raise UserError(
            f"{option} {text}: a size without a unit is bytes, and {text.strip()} bytes holds nothing; "
            f"give a size with its unit (e.g. {option} 40GiB)"
        )
    return values[0]
