"""Fixtures, and tests/ on sys.path so that every test imports its helpers as
``from helpers import ...`` (tests/helpers/), whichever folder it is in.

tests/unit: tests of one module each, no ppx runs or multi-process jobs.
tests/dist: real multi-process jobs (torch.multiprocessing) started by the test.
tests/e2e:  the ``ppx`` command as a user runs it (run, sweep, failures, logging, multinode, SLURM).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import helpers  # noqa: E402, F401  counts the GPUs, then hides them from the processes tests start
from helpers import machine  # noqa: E402

# what ppx keeps of this machine (`ppx plan --calibrate`'s runs) goes to a folder of the test
# session's own: a test neither reads the user's ~/.cache/ppx nor writes there
os.environ["PPX_CACHE_DIR"] = tempfile.mkdtemp(prefix="ppx-cache-")
atexit.register(shutil.rmtree, os.environ["PPX_CACHE_DIR"], True)


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path: Path, config):
    """Collect tests/dist: "dist" is in pytest's default norecursedirs (for build output), so
    `pytest` or `pytest tests` would otherwise pass over the multi-process tests in silence."""
    if collection_path == TESTS / "dist":
        return False
    return None


def pytest_configure(config):
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex  # xdist's controller: its workers' lock files' name
    config.addinivalue_line(
        "markers",
        f"{machine.MARK}: holds a measured time against theory or a bound; it runs with no other test "
        "beside it (make test runs these after the others, in one process; under pytest -n, "
        "tests/helpers/machine.py's lock)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test, with its fixtures' set-up and tear-down, holds the machine: alone if marked."""
    with machine.held(alone=item.get_closest_marker(machine.MARK) is not None):
        yield


def pytest_sessionfinish(session):
    """xdist's controller, which ends last, removes its workers' lock files."""
    run = getattr(session.config.option, "testrunuid", None)
    if run and not hasattr(session.config, "workerinput"):
        for path in machine.lock_files(run):
            path.unlink(missing_ok=True)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run directory path that does not exist yet."""
    return tmp_path / "run"


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """``shared_run(experiment, *overrides)``: a ``helpers.SharedRun``, run once per session
    for the same arguments, for tests that only read it (never write into its directory)."""
    from helpers.run import SharedRuns

    return SharedRuns(tmp_path_factory.mktemp("shared"))
