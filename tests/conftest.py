"""Fixtures, and tests/ on sys.path so that every test imports its helpers as
``from helpers import ...`` (tests/helpers/), whichever folder it is in.

tests/unit: pure-Python tests of one module each, no subprocesses.
tests/dist: real multi-process jobs (torch.multiprocessing) started by the test.
tests/e2e:  the ``ppx`` command as a user runs it (run, sweep, failures, logging, multinode, SLURM).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import helpers  # noqa: E402, F401  counts the GPUs, then hides them from the processes tests start

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
