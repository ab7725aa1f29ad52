"""The W&B writer (`ppx.report.wandb_writer`) as rank 0 starts it: a process of its own, fed one
JSON message a line. What a run's rank 0 sends is in test_logging.py; here, what it does when
rank 0 ends without its summary (failed, killed): a started W&B run keeps the steps that came
and ends as failed, and one not started never starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import REPO, wandb_file


def _writer(messages: list[dict], tmp_path, file_bytes: int | None = None) -> subprocess.CompletedProcess:
    """The writer fed ``init`` (offline, into ``tmp_path``) then ``messages``, stdin then closed;
    ``file_bytes``: every file it writes held to that size (RLIMIT_FSIZE, SIGXFSZ ignored)."""
    init = dict(mode="offline", project="ppx", group="g", name="g/run", dir=str(tmp_path), tags=[], config={"a": 1})
    text = "".join(json.dumps(m) + "\n" for m in [{"init": init}, *messages])
    return subprocess.run(
        [sys.executable, "-m", "ppx.report.wandb_writer"],
        input=text,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=None if file_bytes is None else lambda: _limit(file_bytes),
    )


def _limit(nbytes: int) -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def _started(messages: list[dict], env: dict | None = None) -> subprocess.Popen:
    """A writer sent ``messages``, its stdin left open (rank 0 still there), its output piped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppx.report.wandb_writer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
    proc.stdin.flush()
    return proc


def test_steps_sent_before_rank_0_ended_are_logged_and_the_run_ends_as_failed(tmp_path):
    steps = [{"step": k, "scalars": {"loss": 1.0 / (k + 1), "time/step_time_s": 0.01}} for k in range(3)]
    init = dict(mode="offline", project="ppx", group="g", name="g/run", dir=str(tmp_path), tags=[], config={})
    proc = _started([{"init": init}, *steps, {"start": True}])
    deadline = time.monotonic() + 120
    while not list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")):  # (W&B started)
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.stdin.close()  # (rank 0 gone before its summary)
    proc.stdin = None
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (wb,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [row for row in wandb_file.history(wb) if "loss" in row]
    assert [row["_step"] for row in rows] == [0, 1, 2]
    assert [row["loss"] for row in rows] == [1.0, 0.5, 1.0 / 3]
    assert wandb_file.exit_code(wb) == 1
    assert out == b"" and err == b""  # (the run failed: its own lines say where it is)


@pytest.mark.parametrize("steps", [0, 3])
def test_an_offline_run_that_ended_before_w_and_b_started_leaves_no_w_and_b_run(tmp_path, steps):
    r = _writer([{"step": k, "scalars": {"loss": 1.0}} for k in range(steps)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "wandb").exists()
    assert r.stdout == "" and r.stderr == ""


def test_a_w_and_b_that_cannot_write_its_log_prints_no_logging_errors(tmp_path):
    """W&B's debug.log past a file-size limit: W&B's logging handler fails on each of its lines,
    and Python printed each as a "--- Logging error ---" traceback (some 940 lines, when W&B
    ran in rank 0); the writer ends, saying at most one line of its own."""
    steps = [{"step": k, "scalars": {"loss": 1.0}} for k in range(3)]
    finish = {"run_dir": str(tmp_path), "summary": {"status": "completed"}, "ranks": [], "run_scalars": {}}
    r = _writer([*steps, {"start": True}, {"finish": finish}], tmp_path, file_bytes=2000)
    assert r.returncode == 0, r.stderr
    assert "Logging error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(r.stderr.splitlines()) <= 1, r.stderr
    assert (tmp_path / "wandb").is_dir()  # (W&B started: what it could not write is its own)


def _sink(tmp_path):
    from ppx import config
    from ppx.report.wandb_sink import WandbSink

    cfg = config.load(None, ["logging.wandb.mode=offline", "run.name=sink"])
    return WandbSink(cfg, tmp_path, {"a": 1})


def _end(sink, tmp_path) -> None:
    summary = {"status": "completed", "batch_size": 8, "step_time_s": 0.01, "ranks": []}
    sink.start()
    sink.finish(summary, tmp_path)
    sink.close()


def test_an_offline_run_past_keep_steps_starts_w_and_b_then_not_at_its_end(tmp_path):
    """Its end would log every kept step (about 0.5 ms each): a long run's W&B starts at its
    KEEP_STEPS-th step, and what W&B holds is the same."""
    from ppx.report.wandb_sink import KEEP_STEPS

    sink = _sink(tmp_path)
    for k in range(KEEP_STEPS - 1):
        sink.step(k, {"loss": float(k)})
    assert sink.proc is None  # (the steps kept in rank 0: no process beside them)
    sink.step(KEEP_STEPS - 1, {"loss": float(KEEP_STEPS - 1)})
    assert sink.proc is not None
    deadline = time.monotonic() + 120
    while not list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")):  # W&B started before the end
        assert time.monotonic() < deadline and sink.proc.poll() is None
        time.sleep(0.1)
    _end(sink, tmp_path)
    (wb,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [row for row in wandb_file.history(wb) if "loss" in row]
    assert [row["_step"] for row in rows] == list(range(KEEP_STEPS))
    assert wandb_file.exit_code(wb) == 0


def test_a_killed_writer_is_said_in_one_warning_and_the_run_goes_on(tmp_path, capsys):
    sink = _sink(tmp_path)
    sink.step(0, {"loss": 1.0})
    sink.start()
    sink.proc.kill()  # (the OOM killer, say)
    sink.proc.wait()
    _end(sink, tmp_path)
    err = capsys.readouterr().err.splitlines()
    assert err == ["ppx: warning: the W&B writer ended before the run did (killed by signal 9); not logging to W&B"]


def _unreachable(tmp_path) -> tuple[dict, dict]:
    """An environment whose W&B server is out of reach (its start retries for 30 s), and an
    online ``init``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), WANDB_API_KEY="0" * 40, WANDB_BASE_URL="http://127.0.0.1:9")
    init = dict(mode="online", project="ppx", group="g", name="g/run", dir=str(tmp_path), tags=[], config={})
    return env, init


def _ends(proc) -> tuple[float, float]:
    """Seconds until ``proc``'s output pipes closed (every holder gone), and until it ended."""
    t0 = time.monotonic()
    closed = []
    readers = [
        threading.Thread(target=lambda f=f: (f.read(), closed.append(time.monotonic())))
        for f in (proc.stdout, proc.stderr)
    ]
    for r in readers:
        r.start()
    proc.wait(timeout=120)
    ended = time.monotonic()
    for r in readers:
        r.join(timeout=60)
    return max(closed) - t0, ended - t0


def test_a_writer_whose_rank_0_ended_while_w_and_b_starts_lets_go_within_its_bound(tmp_path):
    """Online against a server out of reach, W&B's start retries for 30 s (90 s by W&B's
    default): a writer whose stdin ends meanwhile lets its output go at once, W&B's service
    holding none of it, and ends within ABANDON_S, not when W&B gives up (it held ppx run's
    output 91.6 s, then W&B's service held it until the writer ended)."""
    from ppx.report.wandb_writer import ABANDON_S

    env, init = _unreachable(tmp_path)
    proc = _started([{"init": init}, {"step": 0, "scalars": {"loss": 1.0}}], env)
    time.sleep(4)  # (W&B's service started meanwhile)
    proc.stdin.close()  # (rank 0 gone while W&B starts)
    closed_s, ended_s = _ends(proc)
    assert closed_s < 2, closed_s
    assert ended_s < ABANDON_S + 5, ended_s
    assert proc.returncode == 1


def test_a_writer_whose_rank_0_was_killed_after_its_summary_ends_within_its_bound(tmp_path):
    """Rank 0 killed alone while it awaited the writer (its summary sent): the writer, whose
    W&B would go on for 30 s, lets go once its parent is gone."""
    from ppx.report.wandb_writer import ABANDON_S

    env, init = _unreachable(tmp_path)
    finish = {"run_dir": str(tmp_path), "summary": {"status": "completed"}, "ranks": [], "run_scalars": {}}
    lines = "".join(json.dumps(m) + "\n" for m in [{"init": init}, {"start": True}, {"finish": finish}])
    rank_0 = (
        "import subprocess, sys, time, os\n"
        "w = subprocess.Popen([sys.executable, '-m', 'ppx.report.wandb_writer'], stdin=subprocess.PIPE)\n"
        f"open({str(tmp_path / 'writer.pid')!r}, 'w').write(str(w.pid))\n"
        f"w.stdin.write({lines!r}.encode()); w.stdin.flush()\n"
        "time.sleep(2); os._exit(9)\n"  # (killed: its pipe to the writer still open until then)
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", rank_0], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env
    )
    closed_s, ended_s = _ends(proc)  # (rank 0 killed at 2 s)
    assert closed_s < ended_s + 2, (closed_s, ended_s)  # (let go within a look at its parent)
    writer = int((tmp_path / "writer.pid").read_text())
    deadline = time.monotonic() + ABANDON_S + 5
    while b"wandb_writer" in _cmdline(writer):
        assert time.monotonic() < deadline, "the writer outlived its bound"
        time.sleep(0.2)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # (gone)
        return b""
