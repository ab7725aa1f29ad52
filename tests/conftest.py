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

PLAIN_AGENT = "plain_agent"

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
    if hasattr(config, "workerinput") or not getattr(
        config.option, "numprocesses", None
    ):  # (a process that runs tests)
        _start_agent_server(config)
    config.addinivalue_line(
        "markers",
        f"{PLAIN_AGENT}: its ppx commands and their runs' torchrun agents start as new processes, as a "
        "user's do, not forked from the session's command and agent servers (ppx/launch/agent_server.py): "
        "the tests of how jobs start and end",
    )
    config.addinivalue_line(
        "markers",
        f"{machine.MARK}: holds a measured time against theory or a bound; it runs with no other test "
        "beside it (make test runs these after the others, in one process; under pytest -n, "
        "tests/helpers/machine.py's lock)",
    )


def _start_agent_server(config) -> None:
    """The agent server every ``ppx run`` of this process's tests starts its CPU job's
    torchrun through (``PPX_AGENT_SERVER``): 2-5 s of importing torch saved a run; and the
    command server its tests' ``ppx`` commands are forked from (`helpers.served_cli`), with
    this process's environment: 0.3-5 s of imports saved a command. Each listens at once and
    imports torch while the first tests run; each ends with this process."""
    from helpers import served_cli
    from ppx.launch.agent_server import TRANSFORMERS, start_server
    from ppx.launch.served_agent import SERVER_ENV

    folder = Path(tempfile.mkdtemp(prefix="ppx-agents-"))
    commands = served_cli.start_server(folder / "commands")
    server = start_server(folder / "socket", preload=[TRANSFORMERS])
    os.environ[SERVER_ENV] = str(folder / "socket")
    os.environ[served_cli.SERVER_ENV] = str(folder / "commands")
    config._ppx_agent_server = (server, folder)
    config._ppx_command_server = commands


def pytest_unconfigure(config):
    server, folder = getattr(config, "_ppx_agent_server", (None, None))
    if server is not None:
        for proc in (server, config._ppx_command_server):
            proc.terminate()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _plain_agent(request, monkeypatch):
    """A test marked `PLAIN_AGENT` runs without the agent and command servers."""
    if request.node.get_closest_marker(PLAIN_AGENT) is not None:
        from helpers import served_cli
        from ppx.launch.served_agent import SERVER_ENV

        monkeypatch.delenv(SERVER_ENV, raising=False)
        monkeypatch.delenv(served_cli.SERVER_ENV, raising=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test, with its fixtures' set-up and tear-down, holds the machine: alone if marked."""
    with machine.held(alone=item.get_closest_marker(machine.MARK) is not None):
        yield


def pytest_sessionfinish(session):
    """xdist's controller, which ends last, removes its workers' lock files; a worker hands it
    the runs its agent server did not serve."""
    config = session.config
    if hasattr(config, "workerinput"):
        config.workeroutput[REFUSED] = _refused(config)
        return
    run = getattr(config.option, "testrunuid", None)
    if run:
        for path in machine.lock_files(run):
            path.unlink(missing_ok=True)


REFUSED = "ppx_agents_refused"
WORKERS_REFUSED = pytest.StashKey[dict]()  # (xdist's controller: each worker's lines, by its id)


def _refused(config) -> list[str]:
    """The lines of this process's agent and command servers for the requests they did not
    serve (each started a new process: `ppx.launch.agent_server._note`)."""
    from ppx.launch.agent_server import refused_path

    _, folder = getattr(config, "_ppx_agent_server", (None, None))
    paths = [refused_path(folder / name) for name in ("socket", "commands")] if folder is not None else []
    return [line for p in paths if p.exists() for line in p.read_text(encoding="utf-8").splitlines()]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker's refused runs, for the summary (a worker that crashed sent none)."""
    worker = getattr(node, "workerinput", {}).get("workerid", str(id(node)))
    node.config.stash.setdefault(WORKERS_REFUSED, {})[worker] = getattr(node, "workeroutput", {}).get(REFUSED, [])


def pytest_terminal_summary(terminalreporter, config):
    """How many of the session's ppx runs and commands its agent and command servers did not
    serve, and why: each started torchrun's agent (2-5 s more) or the command as a new process,
    which the tests of the servers aside (tests/e2e/test_agent_server.py) few should."""
    lines = [x for w in config.stash.get(WORKERS_REFUSED, {}).values() for x in w] + _refused(config)
    if not lines:
        return
    why: dict[str, list[str]] = {}
    for line in lines:
        reason, _, command = line.partition("\t")
        why.setdefault(reason, []).append(command)
    terminalreporter.section("ppx agent server")
    terminalreporter.write_line(
        f"{len(lines)} requests the agent and command servers did not serve (each started a new process):"
    )
    for reason, commands in sorted(why.items(), key=lambda kv: -len(kv[1])):
        example = next((c for c in commands if c), "")
        terminalreporter.write_line(f"  {len(commands)} x {reason}" + (f"; e.g. {example[:300]}" if example else ""))


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
