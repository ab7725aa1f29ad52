"""`ppx.plan.sizes`: byte sizes on the command line, and malformed ones as one line."""

from __future__ import annotations

import pytest

from ppx.errors import UserError
from ppx.plan.sizes import parse_size, parse_sizes
from ppx.units import format_bytes


@pytest.mark.parametrize(
    "text, want",
    [
        ("40GiB", 40 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5e9", 1.5e9),
        ("64KB", 64_000),
        ("64kib", 64 * 1024),
        ("2 GB", 2e9),
        ("100", 100),
        ("7B", 7),
    ],
)
def test_sizes_parse_to_bytes(text, want):
    assert parse_size("--mem-budget", text) == want


@pytest.mark.parametrize("text", ["", "GiB", "40GiBs", "-1GiB", "1,5GiB", "forty", "1e999"])
def test_malformed_sizes_are_one_line_naming_the_option(text):
    with pytest.raises(UserError) as e:
        parse_size("--mem-budget", text)
    assert str(e.value).startswith("--mem-budget ") and "\n" not in str(e.value)


def test_lists_of_sizes():
    assert parse_sizes("--act-bytes", "1MiB,2MiB") == [2**20, 2 * 2**20]
    with pytest.raises(UserError, match="empty entry"):
        parse_sizes("--act-bytes", "1MiB,,2MiB")


def test_format_bytes_picks_the_unit():
    assert format_bytes(1.5 * 2**30) == "1.50 GiB"
    assert format_bytes(512 * 2**20) == "512.0 MiB"
    assert format_bytes(12) == "12 B"
