"""An exception in one line (`ppx.errors.first_line`, `said`): every one-line error ppx prints
about an exception it caught says it this way."""

from __future__ import annotations

from ppx.errors import first_line, said


def test_first_line_of_a_message():
    assert first_line(ValueError("bad value\nmore detail")) == "bad value"
    assert first_line(ValueError("\n  indented first\n")) == "indented first"
    # a first line that only announces the next one takes it along
    assert first_line(RuntimeError("Error(s) in loading:\n\tMissing key: w\n\tother")) == (
        "Error(s) in loading: Missing key: w"
    )
    assert first_line("a text\nsecond") == "a text"


def test_said_names_the_type_and_never_fails_on_an_empty_message():
    assert said(KeyError("k")) == "KeyError: 'k'"
    assert said(ValueError()) == "ValueError"
    assert said(RuntimeError("  \n ")) == "RuntimeError"
    assert first_line(ValueError()) == ""
