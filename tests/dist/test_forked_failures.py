"""torchrun's forked ranks (`ppx.launch.torchrun`, CPU runs): every failed rank's exit code
reaches the launcher, not only the first one torch's MultiprocessContext saw (real forked
processes through torch's own start_processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

from helpers.job import process_state
from ppx.launch.torchrun import FAILED_GRACE_S, _report_every_failed_fork


def _rank(how: str) -> None:
    if how == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def _forked(tmp_path, fn, args: dict):
    """Two ranks of ``fn`` (rank -> its arguments) forked by torch's start_processes, as
    torchrun forks CPU ranks."""
    logs = DefaultLogsSpecs(log_dir=str(tmp_path))
    return start_processes("ranks", fn, args=args, envs={0: {}, 1: {}}, logs_specs=logs, start_method="fork")


def _exit_codes(ctx, result) -> dict[int, int]:
    """The failed ranks' exit codes of ``result`` (a poll's), ``ctx`` closed."""
    ctx.close()
    assert result is not None, "the ranks never ended"
    return {rank: f.exitcode for rank, f in result.failures.items()}


def _failures(tmp_path) -> dict[int, int]:
    ctx = _forked(tmp_path, _rank, {0: ("exit",), 1: ("kill",)})
    deadline = time.monotonic() + 30
    # both ranks over before torch's first look, as when they fail together: no race between
    # its polls and the ranks (torch's own poll then reports one of them, whichever it finds first)
    while not all(process_state(pid) in ("Z", "gone") for pid in ctx.pids().values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    while (result := ctx.wait(0.2)) is None and time.monotonic() < deadline:
        pass
    return _exit_codes(ctx, result)


@pytest.fixture
def handlers():
    """The signal handlers torch's start_processes replaces in this process, put back after."""
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    before = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, h in before.items():
        signal.signal(s, h)


def test_every_failed_fork_is_reported(tmp_path, monkeypatch, handlers):
    monkeypatch.setattr(MultiprocessContext, "_poll", MultiprocessContext._poll)  # restored after the test
    _report_every_failed_fork()
    assert _failures(tmp_path) == {0: 3, 1: -signal.SIGKILL}


def _failed_or_survivor(marker: str, code: int, survive_s: float | None) -> None:
    """The failed rank (``survive_s`` None) leaves ``marker`` and exits at once; a survivor
    exits ``survive_s`` after the marker says its peer is gone (as a survivor names it first)."""
    if survive_s is None:
        Path(marker).touch()
        sys.exit(code)
    while not Path(marker).exists():
        time.sleep(0.005)
    time.sleep(survive_s)
    sys.exit(code)


def _held_failure(tmp_path, survive_s: float) -> tuple[dict[int, int], float]:
    """Rank 1 exits with 3 at once, rank 0 with 4 (`_failed_or_survivor`), polled as torchrun
    polls forked ranks: the exit codes reported, and how long after rank 1 was seen ended
    they were (seconds)."""
    marker = str(tmp_path / "gone")
    ctx = _forked(tmp_path, _failed_or_survivor, {0: (marker, 4, survive_s), 1: (marker, 3, None)})
    deadline = time.monotonic() + 30
    while process_state(ctx.pids()[1]) not in ("Z", "gone") and time.monotonic() < deadline:
        time.sleep(0.01)
    ended = time.monotonic()
    while (result := ctx.wait(0)) is None and time.monotonic() < deadline:
        time.sleep(0.1)  # (torchrun's look at forked ranks: `torchrun_command`)
    reported = time.monotonic() - ended
    return _exit_codes(ctx, result), reported


def test_a_failure_is_held_back_for_the_survivors_grace(tmp_path, monkeypatch, handlers):
    """torchrun looks every 0.1 s at forked ranks (`torchrun_command`): a failed rank's survivors
    still get FAILED_GRACE_S to end on their own (to name the dead peer) before its SIGTERM."""
    monkeypatch.setattr(MultiprocessContext, "_poll", MultiprocessContext._poll)
    _report_every_failed_fork()
    (tmp_path / "quick").mkdir()
    codes, reported = _held_failure(tmp_path / "quick", survive_s=0.15)
    assert codes == {0: 4, 1: 3}, (codes, reported)  # the survivor ended on its own, not by torchrun's SIGTERM
    (tmp_path / "slow").mkdir()
    codes, reported = _held_failure(tmp_path / "slow", survive_s=60.0)
    # ended by torchrun (its SIGTERM, which torch's fork wrapper turns into exit code 1), after the grace
    assert codes[1] == 3 and codes[0] != 4, (codes, reported)
    assert FAILED_GRACE_S <= reported < FAILED_GRACE_S + 5, reported


def test_the_agent_freezes_what_it_imported_for_its_forks():
    """What torchrun's agent imported for its forked ranks is out of the collector's walks
    (gc.freeze): a rank's first collection walks only its own objects, not torch's again."""
    code = "import gc; from ppx.launch.torchrun import import_for_the_workers as f; f(); print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 100_000, out.stdout  # (torch and torch._dynamo: about 300,000 objects)


def test_the_agent_imports_a_hugging_face_models_modules_for_its_forks(tmp_path):
    """A model.kind=hf run's agent imports transformers and the architecture's modules before
    it hands torchrun the job that forks its ranks (each had imported them: 4-5 s a rank); a
    config it cannot read is left to the ranks, which say what is wrong."""
    pytest.importorskip("transformers")
    from ppx import config

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.yaml").write_text(config.to_yaml(config.load("hf_llama_tiny_1f1b_2cpu")))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.yaml").write_text("model: [")
    code = (
        "import sys, torch.distributed.run as r; from ppx.launch import torchrun, processes; "
        "r.main = lambda argv: print('transformers.models.llama.modeling_llama' in sys.modules); "
        "torchrun._main(processes.torchrun_command(2, sys.argv[1], fork=True)[3:], None)"
    )
    got = {}
    for run in ("hf", "bad"):
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / run)], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        got[run] = out.stdout.strip()
    assert got == {"hf": "True", "bad": "False"}
