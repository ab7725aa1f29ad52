"""An exception in one line (`ppx.errors.first_line`, `said`): every one-line error ppx prints
about an exception it caught says it this way."""

from __future__ import annotations

from ppx.errors import first_line, raised_at, said, said_where


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


CAUGHT = "def f(call):\n    try:\n        call()\n    except Exception as e:\n        return e\n"
RAISE = "def g():\n    raise ValueError('broke')\n"


def _in(path, source: str, name: str):
    """``name`` from ``source`` compiled as the file ``path`` (its frames name that file)."""
    space: dict = {}
    exec(compile(source, str(path), "exec"), space)
    return space[name]


def test_where_the_users_code_raised_is_its_innermost_frame_outside_python_packages_and_ppx(tmp_path, monkeypatch):
    import sysconfig

    import ppx

    monkeypatch.chdir(tmp_path)
    packages = sysconfig.get_paths()["purelib"]
    caught_in_ppx = _in(f"{ppx.__path__[0]}/engine/fake.py", CAUGHT, "f")
    users = _in(tmp_path / "mypkg" / "model.py", RAISE, "g")
    e = caught_in_ppx(users)  # ppx's frame, then the user's, which raised
    assert raised_at(e) == "mypkg/model.py:2"
    assert said_where(e) == "ValueError: broke (at mypkg/model.py:2)"
    in_torch = _in(f"{packages}/torch/fake.py", RAISE, "g")
    e = caught_in_ppx(lambda: in_torch())  # the user's (this test's lambda) calls torch, which raised
    assert raised_at(e) == f"{__file__}:{e.__traceback__.tb_next.tb_lineno}"  # (outside the working folder: whole)
    assert raised_at(caught_in_ppx(in_torch)) is None  # ppx called torch: none of the user's code
    assert said_where(caught_in_ppx(in_torch)) == "ValueError: broke"
    assert raised_at(ValueError("never raised")) is None
