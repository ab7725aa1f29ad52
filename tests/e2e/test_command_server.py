"""The suite's command server (ppx/launch/agent_server.py serving ``python -m ppx.cli``,
tests/helpers/served_cli.py) forks a ``ppx`` command as a new Python would run it: the same
output and exit status, a user's module imported from PYTHONPATH, its non-daemon threads
waited for and its atexit functions run at the end; a command whose new process would import
another module than the server did (a stand-in for a package on PYTHONPATH) is not served,
and gets a new process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, ppx, served_cli
from ppx.launch.agent_server import refused_path, wait_for
from ppx.models.hf_config import IMPORT_SETTINGS

pytestmark = pytest.mark.plain_agent  # (a command served only where a test says so)

# a user's module: the model of helpers/own_module.py, a thread that ends after the command's
# last line, and an atexit function; each writes where PPX_TEST_ENDS says
ENDS = """
import atexit, os, sys, threading, time

from helpers.own_module import build  # noqa: F401

OUT = os.environ["PPX_TEST_ENDS"]


def _write(name, text):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(text + "\\n")


def _late():
    time.sleep(0.5)
    _write("thread", "done")


def _at_exit():
    _write("atexit", sys.argv[0] + " " + sys.modules["__main__"].__file__)


if __name__ != "__main__" and not os.path.exists(os.path.join(OUT, "started")):
    _write("started", sys.argv[0])
    threading.Thread(target=_late).start()
    atexit.register(_at_exit)
"""
EXITS = "import sys\n\nsys.exit('the module ended the command')\n"
STOPS = "class Stop(BaseException):\n    pass\n\n\nraise Stop('no code of ppx catches it')\n"


@pytest.fixture
def commands(request) -> Path:
    """This test process's command server's socket (tests/conftest.py)."""
    _, folder = request.config._ppx_agent_server
    wait_for(folder / "commands")
    return folder / "commands"


def _both(args: list[str], commands: Path, monkeypatch, plain_env=None, served_env=None) -> tuple:
    """(a new process's, the served one's) CompletedProcess of ``ppx <args>``, each with this
    process's environment and its ``*_env`` added."""
    command = [sys.executable, "-m", "ppx.cli", *args]
    env = dict(os.environ, **(plain_env or {}))
    plain = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    monkeypatch.setenv(served_cli.SERVER_ENV, str(commands))
    served = served_cli.served_run(command, dict(os.environ, **(served_env or {})), REPO, timeout=120)
    assert served is not None, refused_path(commands).read_text()
    return plain, served


def test_a_served_command_is_the_new_processs_command(commands, tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "ends.py").write_text(ENDS)
    path = os.pathsep.join([str(tmp_path / "models"), str(REPO / "tests")])
    own = ["model.kind=module", "model.module=ends:build", "model.data=regression", "model.hidden=16"]
    env = {way: {"PYTHONPATH": path, "PPX_TEST_ENDS": str(tmp_path / way)} for way in ("plain", "served")}
    for way in env:
        (tmp_path / way).mkdir()
    plain, served = _both(["split", "1f1b_2cpu", *own, "model.layers=4"], commands, monkeypatch, *env.values())
    assert plain.returncode == served.returncode == 0, plain.stderr + served.stderr
    assert (plain.stdout, plain.stderr) == (served.stdout, served.stderr)
    assert "would split 2, 2" in plain.stdout.splitlines()[-1], plain.stdout
    ends = {way: {p.name: p.read_text() for p in (tmp_path / way).iterdir()} for way in env}
    cli = str(REPO / "ppx" / "cli.py")
    want = {"started": cli + "\n", "thread": "done\n", "atexit": f"{cli} {cli}\n"}
    assert ends["plain"] == ends["served"] == want, ends
    # a module that ends the command as it is imported: SystemExit's text, exit status 1
    (tmp_path / "models" / "exits.py").write_text(EXITS)
    own[1] = "model.module=exits:build"
    plain, served = _both(["split", "1f1b_2cpu", *own], commands, monkeypatch, env["plain"], env["served"])
    assert plain.returncode == served.returncode == 1 and (plain.stdout, plain.stderr) == (served.stdout, served.stderr)
    assert "the module ended the command" in served.stderr
    # one that raises what no code catches: Python's traceback from runpy's first frame, status 1
    (tmp_path / "models" / "stops.py").write_text(STOPS)
    own[1] = "model.module=stops:build"
    plain, served = _both(["split", "1f1b_2cpu", *own], commands, monkeypatch, env["plain"], env["served"])
    assert plain.returncode == served.returncode == 1 and (plain.stdout, plain.stderr) == (served.stdout, served.stderr)
    first, frame = served.stderr.splitlines()[:2]
    assert first == "Traceback (most recent call last):" and frame.startswith('  File "<frozen runpy>", line ')
    assert frame.endswith(", in _run_module_as_main"), served.stderr
    assert served.stderr.splitlines()[-1] == "stops.Stop: no code of ppx catches it"
    # bad input: its one line and exit status 2, no traceback
    plain, served = _both(["run", "no_such_experiment"], commands, monkeypatch)
    assert plain.returncode == served.returncode == 2 and plain.stdout == served.stdout == ""
    assert plain.stderr == served.stderr and served.stderr.startswith("ppx: error: unknown experiment")


def test_a_command_whose_new_process_imports_another_module_is_not_served(commands, tmp_path, monkeypatch):
    """A stand-in for a package the server imported (yaml, OmegaConf's), on PYTHONPATH: the
    server would have run its own; the command gets a new process, where the stand-in is read."""
    noted = refused_path(commands)  # (each refusal a line there, for the suite's summary)
    before = noted.stat().st_size if noted.exists() else 0
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "__init__.py").write_text("raise ImportError('the stand-in yaml')\n")
    command = [sys.executable, "-m", "ppx.cli", "keys"]
    monkeypatch.setenv(served_cli.SERVER_ENV, str(commands))
    try:
        env = dict(os.environ, PYTHONPATH=_first_on_path(tmp_path))
        assert served_cli.served_run(command, env, REPO, timeout=60) is None
        why, _, said = noted.read_text().splitlines()[-1].partition("\t")
        assert why.startswith(f"yaml is {tmp_path / 'yaml' / '__init__.py'} there, ") and said == " ".join(command)
        hashed = dict(os.environ, PYTHONHASHSEED="7")  # (read as torch was imported: the server's is not)
        assert served_cli.served_run(command, hashed, REPO, timeout=60) is None
        # PYTHONPATH relative to the command's working folder, not the server's
        (tmp_path / "work" / "rel").mkdir(parents=True)
        (tmp_path / "yaml").rename(tmp_path / "work" / "rel" / "yaml")
        relative = dict(os.environ, PYTHONPATH=_first_on_path("rel"))
        assert served_cli.served_run(command, relative, tmp_path / "work", timeout=60) is None
        stand_in = tmp_path / "work" / "rel" / "yaml" / "__init__.py"
        assert noted.read_text().splitlines()[-1].startswith(f"yaml is {stand_in} there")
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text("")  # (a new Python runs it as it starts)
        custom = dict(os.environ, PYTHONPATH=_first_on_path(tmp_path / "site"))
        assert served_cli.served_run(command, custom, REPO, timeout=60) is None
        assert noted.read_text().splitlines()[-1].startswith(f"sitecustomize is {tmp_path / 'site'}")
        r = ppx("keys", env={"PYTHONPATH": _first_on_path(tmp_path / "work" / "rel")})  # (a new process)
        assert r.returncode != 0 and "the stand-in yaml" in r.stderr
        assert served_cli.served_run(command, dict(os.environ), REPO, timeout=60).returncode == 0
        # transformers' settings as ppx sets them (after a model.kind=hf config was loaded): served
        quiet = dict(os.environ, **IMPORT_SETTINGS)
        assert served_cli.served_run(command, quiet, REPO, timeout=60).returncode == 0
    finally:  # (this test's own refusals are no command's fallback: left out of the summary)
        if noted.exists():
            os.truncate(noted, before)


def _first_on_path(folder) -> str:
    """PYTHONPATH with ``folder`` before this process's own (a checkout's ppx, where it names one)."""
    return os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])
