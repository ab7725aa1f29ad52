"""tests/helpers/machine.py: under pytest-xdist a ``timing`` test has the machine to itself,
shared tests run side by side, and a timing test that waits lets no shared test start."""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
import uuid

import pytest

from helpers import machine


@pytest.mark.timing
def test_a_timing_test_runs_alone_and_shared_ones_side_by_side(monkeypatch):
    run = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    spans: dict[str, tuple[float, float]] = {}

    def test(name: str, alone: bool, after_s: float, lasts_s: float) -> threading.Thread:
        def body():
            time.sleep(after_s)
            with machine.held(alone):  # each its own open files, as each worker has
                start = time.monotonic()
                time.sleep(lasts_s)
                spans[name] = (start, time.monotonic())

        t = threading.Thread(target=body)
        t.start()
        return t

    threads = [
        test("shared 1", False, 0.0, 0.4),
        test("shared 2", False, 0.05, 0.4),  # beside shared 1
        test("timing", True, 0.1, 0.2),  # waits for both
        test("shared 3", False, 0.2, 0.1),  # asks while timing waits: after it
    ]
    for t in threads:
        t.join(10)
    try:
        assert set(spans) == {"shared 1", "shared 2", "timing", "shared 3"}
        overlap = lambda a, b: spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]  # noqa: E731
        assert overlap("shared 1", "shared 2")
        assert not any(overlap("timing", other) for other in ("shared 1", "shared 2", "shared 3"))
        assert spans["shared 3"][0] >= spans["timing"][1]
    finally:
        for path in machine.lock_files(run):
            path.unlink(missing_ok=True)


def test_without_xdist_every_test_is_alone_and_nothing_is_locked(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    before = machine.alone()  # this test's own hold (conftest.py)
    with machine.held(alone=False):
        assert machine.alone()
    assert machine.alone() == before


def test_a_forked_child_that_outlives_its_test_holds_no_lock(monkeypatch):
    run = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    with machine.held(alone=True):
        ready, started = os.pipe()
        child = os.fork()
        if child == 0:  # outlives the hold (its fork handlers have run by its first line)
            os.write(started, b"1")
            time.sleep(3)
            os._exit(0)
        os.read(ready, 1)
        os.close(ready)
        os.close(started)
    try:
        with open(machine.lock_files(run)[1], "a") as room:
            fcntl.flock(room, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while the child holds it
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        for path in machine.lock_files(run):
            path.unlink(missing_ok=True)
