"""The W&B writer (`ppx.report.wandb_writer`) as rank 0 starts it: a process of its own, fed one
JSON message a line. What a run's rank 0 sends is in test_logging.py; here, what it does when
rank 0 ends without its summary (failed, killed): the steps that came are logged, and the W&B
run ends as failed."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import REPO, wandb_file


def _writer(messages: list[dict], tmp_path) -> subprocess.CompletedProcess:
    init = dict(mode="offline", project="ppx", group="g", name="g/run", dir=str(tmp_path), tags=[], config={"a": 1})
    text = "".join(json.dumps(m) + "\n" for m in [{"init": init}, *messages])
    return subprocess.run(
        [sys.executable, "-m", "ppx.report.wandb_writer"],
        input=text,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_steps_sent_before_rank_0_ended_are_logged_and_the_run_ends_as_failed(tmp_path):
    steps = [{"step": k, "scalars": {"loss": 1.0 / (k + 1), "time/step_time_s": 0.01}} for k in range(3)]
    r = _writer(steps, tmp_path)
    assert r.returncode == 0, r.stderr
    (wb,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [row for row in wandb_file.history(wb) if "loss" in row]
    assert [row["_step"] for row in rows] == [0, 1, 2]
    assert [row["loss"] for row in rows] == [1.0, 0.5, 1.0 / 3]
    assert wandb_file.exit_code(wb) == 1
    assert "ppx: W&B offline run" not in r.stdout  # (the run failed: its own lines say where it is)


def test_a_rank_0_that_ended_before_its_first_step_leaves_no_w_and_b_run(tmp_path):
    r = _writer([], tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "wandb").exists()
    assert r.stdout == "" and r.stderr == ""
