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
import time

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


def test_steps_sent_before_rank_0_ended_are_logged_and_the_run_ends_as_failed(tmp_path):
    steps = [{"step": k, "scalars": {"loss": 1.0 / (k + 1), "time/step_time_s": 0.01}} for k in range(3)]
    r = _writer([*steps, {"start": True}], tmp_path)
    assert r.returncode == 0, r.stderr
    (wb,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [row for row in wandb_file.history(wb) if "loss" in row]
    assert [row["_step"] for row in rows] == [0, 1, 2]
    assert [row["loss"] for row in rows] == [1.0, 0.5, 1.0 / 3]
    assert wandb_file.exit_code(wb) == 1
    assert "ppx: W&B offline run" not in r.stdout  # (the run failed: its own lines say where it is)


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


def test_a_writer_whose_rank_0_ended_while_w_and_b_starts_lets_go_within_its_bound(tmp_path):
    """Online against a server out of reach, W&B's start retries for 30 s (90 s by W&B's
    default): a writer whose stdin ends meanwhile lets its output go and ends within
    ABANDON_S, not when W&B gives up (it held ppx run's output 91.6 s)."""
    from ppx.report.wandb_writer import ABANDON_S

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), WANDB_API_KEY="0" * 40, WANDB_BASE_URL="http://127.0.0.1:9")
    init = dict(mode="online", project="ppx", group="g", name="g/run", dir=str(tmp_path), tags=[], config={})
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppx.report.wandb_writer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    proc.stdin.write(
        (json.dumps({"init": init}) + "\n" + json.dumps({"step": 0, "scalars": {"loss": 1.0}}) + "\n").encode()
    )
    proc.stdin.close()  # (rank 0 gone while W&B starts)
    proc.stdin = None  # (communicate: nothing more to send)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=ABANDON_S + 60)
    assert time.monotonic() - t0 < ABANDON_S + 8, (out, err)
    assert out == b"" and err == b""  # (the run's own lines say what happened)
