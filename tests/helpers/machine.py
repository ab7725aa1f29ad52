"""The machine shared by pytest-xdist's workers (``pytest -n``): a test marked ``timing`` (it
holds a measured time against theory or a bound) runs alone, with no other test beside it; the
others share the machine. (``make test`` runs the timing tests after the others, in one process
of their own, so that none waits for the running shared tests in the middle of the suite; this
lock keeps any other ``pytest -n`` honest.) A readers-writer lock on two files that
every worker of one test session opens: ``gate`` (held by a timing test from its wait to its
end, so that no shared test starts while it waits) and ``room`` (shared, or exclusive for a
timing test). One process (plain ``pytest``): every test is alone, and nothing is locked."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

MARK = "timing"
_alone = False  # whether the running test has the machine to itself
_open: list = []  # the lock files this process holds open


def _forget_in_child() -> None:
    """A forked child (no exec) shares its parent's locks until every copy of the files closes:
    it closes its copies, so one that outlives its test holds nothing (no LOCK_UN: that would
    unlock the parent too)."""
    for f in _open:
        f.close()
    _open.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def lock_files(run: str) -> list[Path]:
    """The two files of test session ``run`` (xdist's ``PYTEST_XDIST_TESTRUNUID``)."""
    return [Path(tempfile.gettempdir()) / f"ppx-tests-{run}.{name}" for name in ("gate", "room")]


@contextlib.contextmanager
def held(alone: bool) -> Iterator[None]:
    """The machine for one test: to itself if ``alone``, else shared with other shared tests."""
    global _alone
    before, opened_before = _alone, list(_open)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    with contextlib.ExitStack() as files:  # closing them unlocks
        if run is not None:
            gate, room = (files.enter_context(open(path, "a")) for path in lock_files(run))
            _open[:] = [gate, room]
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        _alone = alone or run is None
        try:
            yield
        finally:
            _alone = before
            _open[:] = opened_before


def alone() -> bool:
    """Whether the running test has the machine to itself (what it measures is its own)."""
    return _alone
