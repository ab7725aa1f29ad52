"""Runs that fail outside an action's own code: a sweep's failed points (some, or all), a sweep
that cannot submit to SLURM, and files that cannot be written (a full disk)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, ppx
from helpers.job import end, read_log, start_run, wait_for_step


def test_a_sweep_with_a_failed_point_compares_the_rest_and_exits_1(tmp_path):
    """One point's rank dies at its action 1F1 (runtime.inject_fault): that run ends, the sweep
    goes on, compares what completed, names the failure and exits 1."""
    r = ppx(
        "sweep",
        "1f1b_2cpu",
        "--sweep",
        "runtime.inject_fault=null,die@1F1",
        "model.kind=synthetic",
        "model.hidden=16",
        "train.steps=2",
        "logging.wandb.mode=disabled",
        f"run.root={tmp_path}",
        timeout=180,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "ppx sweep: 1 run(s) failed: runtime.inject_fault=die@1F1" in r.stderr, r.stderr[-3000:]
    (sweep,) = (tmp_path / "1f1b_2cpu").iterdir()
    done, failed = sweep / "inject_fault=null", sweep / "inject_fault=die@1F1"
    assert (done / "summary.json").exists() and not (failed / "summary.json").exists()
    table = (sweep / "compare.md").read_text()
    assert "| inject_fault=null |" in table and "| inject_fault=die@1F1 |" not in table
    # the comparison's files say which run is not in them (stderr alone said it)
    assert "note: left out 1 run(s) that did not complete: inject_fault=die@1F1" in table


def test_a_sweep_whose_point_failed_before_its_folder_exits_1(tmp_path):
    """A point that fails before its run folder is made (runtime.device=cuda without GPUs: the
    tests hide them) is counted: the sweep exited 0, counting folders."""
    args = ("sweep", "gpipe_2cpu", "--sweep", "runtime.device=cpu,cuda", "train.steps=2", "logging.wandb.mode=disabled")
    r = ppx(*args, f"run.root={tmp_path}", timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "ppx sweep: 1 run(s) failed: runtime.device=cuda" in r.stderr
    (sweep,) = (tmp_path / "gpipe_2cpu").iterdir()
    assert (sweep / "device=cpu" / "summary.json").exists() and not (sweep / "device=cuda").exists()


def test_a_sweep_whose_comparison_cannot_be_written_exits_1_not_as_bad_input(tmp_path):
    """Its runs completed and its comparison failed (here compare.json, taken by a folder while
    the points ran): exit 2, bad input's, with the OS's words alone; now 1 and the sweep's folder."""
    cmd = [sys.executable, "-m", "ppx.cli", "sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=2,4"]
    args = ["train.steps=2", "logging.wandb.mode=disabled", "logging.report=false", f"run.root={tmp_path}"]
    proc = subprocess.Popen([*cmd, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "gpipe_2cpu").glob("sweep-*/microbatches=2")) and time.monotonic() < deadline:
        time.sleep(0.05)
    (sweep,) = (tmp_path / "gpipe_2cpu").glob("sweep-*")
    (sweep / "compare.json").mkdir()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    said = f"(Is a directory: {sweep / 'compare.json'}); its runs: {sweep}\n"
    assert err.endswith(f"ppx: error: the sweep's comparison was not written {said}")


def test_a_slurm_sweep_that_submits_nothing_leaves_no_folder(tmp_path):
    """No sbatch on the PATH: one line, and neither the sweep folder nor the folders made for it
    (run.root, <run.name>) are left behind; a run.root that was there already stays."""
    root = tmp_path / "new" / "root"
    args = ("sweep", "gpipe_2cpu", "--launcher", "slurm", "--sweep", "pipeline.microbatches=2,4")
    r = ppx(*args, f"run.root={root}", env={"PATH": str(tmp_path / "no-bin")}, timeout=60)
    assert (r.returncode, r.stderr.splitlines()) == (
        2,
        ["ppx: error: sbatch not found: --launcher slurm needs a SLURM cluster"],
    )
    assert list(tmp_path.iterdir()) == []
    root.mkdir(parents=True)
    r = ppx(*args, f"run.root={root}", env={"PATH": str(tmp_path / "no-bin")}, timeout=60)
    assert r.returncode == 2 and list(root.iterdir()) == []


def _file_size_limit(nbytes: int):
    """A child's files held to ``nbytes`` (RLIMIT_FSIZE; SIGXFSZ ignored, so a write past it
    fails with EFBIG, as one on a full disk fails with ENOSPC)."""

    def limit() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return limit


@pytest.mark.parametrize(
    "nbytes,steps", [(100, 400), (30_000, 400), (12_000, 3)], ids=["at-start", "mid-run", "at-the-end"]
)
def test_a_run_that_cannot_write_its_files_says_so_in_one_line(tmp_path, nbytes, steps):
    """Files that cannot grow (a full disk): before the run, one line and no run folder left;
    mid-run, the rank's own line with the error and the job ended, no traceback (a cause file
    that could not be written made the failing rank raise again, its line lost); at the end,
    no file written in part (timeline.json was, which tools read back)."""
    run_dir = tmp_path / "run"
    args = ["1f1b_2cpu", f"train.steps={steps}", f"run.dir={run_dir}", "logging.wandb.mode=disabled"]
    r = subprocess.run(
        [sys.executable, "-m", "ppx.cli", "run", *args, "logging.report=false", "logging.tensorboard=false"],
        preexec_fn=_file_size_limit(nbytes),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    if nbytes == 100:
        assert (r.returncode, r.stderr) == (
            2,
            f"ppx: error: cannot write the run directory {run_dir}: File too large\n",
        )
        assert not run_dir.exists()
    else:
        assert r.returncode == 1, r.stderr[-3000:]
        where = "step metrics" if steps > 3 else "writing the summary and logs"
        # (3 steps: metrics.jsonl 3 KB, summary.json 5 KB, timeline.json 20 KB; a file written whole is named)
        file = "" if steps > 3 else rf": '{re.escape(str(run_dir))}/\w+\.json'"
        line = rf"ppx: error: rank 0 failed on {where} \(step \d+\): OSError: \[Errno 27\] File too large{file}\n"
        assert re.search(line, r.stderr), r.stderr[-3000:]
        assert (run_dir / "incomplete.txt").exists()
        for f in run_dir.glob("*.json"):  # (each whole, or not there)
            json.loads(f.read_text())
        assert not list(run_dir.glob("*.tmp")) and not (run_dir / "timeline.json").exists()


def test_a_run_past_a_file_size_limit_with_wandb_on_fails_in_one_line(tmp_path):
    """Every file held to 2000 bytes: the run's one line alone says what failed (ppx's own
    metrics.jsonl, past the limit), with no W&B logging errors (W&B's debug.log past the limit
    printed some 940 lines of "--- Logging error ---" when W&B ran in rank 0; its writer,
    tests/e2e/test_wandb_writer.py), and no W&B run: an offline one starts once the steps are over."""
    run_dir = tmp_path / "run"
    args = ["gpipe_2cpu", "train.steps=2", f"run.dir={run_dir}", "logging.wandb.mode=offline"]
    r = subprocess.run(
        [sys.executable, "-m", "ppx.cli", "run", *args, "logging.report=false", "logging.tensorboard=false"],
        preexec_fn=_file_size_limit(2000),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert "Logging error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("ppx: error: ")]
    assert len(errors) == 1 and re.fullmatch(
        r"ppx: error: rank 0 failed on .*: OSError: \[Errno 27\] File too large", errors[0]
    ), r.stderr
    assert (run_dir / "incomplete.txt").exists() and not (run_dir / "wandb").exists()


def test_a_profiler_trace_that_cannot_be_written_fails_the_run(tmp_path):
    """Traces (some 300 KB a rank) past a 100 KB file-size limit: torch's export logs "Failed to
    write to log file!" and returns, and the run completed with only the traces' truncated
    ``.tmp`` files; now the rank fails in one line naming the trace, the ``.tmp`` removed."""
    run_dir = tmp_path / "run"
    args = ["gpipe_2cpu", "train.steps=4", "profile.enabled=true", f"run.dir={run_dir}", "logging.wandb.mode=disabled"]
    r = subprocess.run(
        [sys.executable, "-m", "ppx.cli", "run", *args, "logging.report=false"],
        preexec_fn=_file_size_limit(100_000),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("ppx: error: ")]
    trace = re.escape(str(run_dir / "tb")) + r"/rank\d\.\d+\.pt\.trace\.json"
    line = rf"ppx: error: rank \d failed on .*: TraceNotWritten: torch.profiler could not write {trace} .*"
    assert len(errors) == 1 and re.fullmatch(line, errors[0]), r.stderr[-3000:]
    assert (run_dir / "incomplete.txt").exists()
    assert not list((run_dir / "tb").glob("*.tmp")) and not list((run_dir / "tb").glob("*.pt.trace.json"))


def test_a_report_that_cannot_be_written_leaves_no_part_of_it(tmp_path):
    """report.html past the files' limit is a warning, the run complete; its part written beside
    it (report.html.tmp) was left, and on a full disk filled it for the writes after it."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "ppx.cli", "run", "gpipe_2cpu", "train.steps=2", f"run.dir={run_dir}"]
    r = subprocess.run(
        [*cmd, "logging.wandb.mode=disabled", "logging.report=true"],
        preexec_fn=_file_size_limit(1_000_000),  # (the page is a few MB, every other file less than this)
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    said = f"ppx: warning: report.html not written (OSError: [Errno 27] File too large: '{run_dir / 'report.html'}')\n"
    assert said in r.stderr, r.stderr
    assert (run_dir / "summary.json").exists() and sorted(p.name for p in run_dir.glob("*.tmp")) == []


def test_a_sweep_whose_every_point_failed_exits_1_not_as_bad_input(tmp_path):
    """Runs that failed are no bad input (exit 2): 1, as for a sweep with some failed points."""
    r = ppx(
        "sweep",
        "1f1b_2cpu",
        "--sweep",
        "pipeline.microbatches=2,4",
        "runtime.inject_fault=die@1F0",
        "train.steps=2",
        "logging.wandb.mode=disabled",
        f"run.root={tmp_path}",
        timeout=180,
    )
    (sweep,) = (tmp_path / "1f1b_2cpu").iterdir()
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == f"ppx: error: no run of the sweep completed; see {sweep}"


def test_a_run_directory_removed_mid_run_ends_the_job_in_lines_of_its_own(tmp_path):
    """Removed while the job ran: the rank that fails on it says so in its line, TensorBoard's
    writer thread in one line of its own (it printed a 15-line traceback), and the last line
    says the folder is gone."""
    run_dir = tmp_path / "run"
    proc, log = start_run("1f1b_2cpu", run_dir, tmp_path, "train.steps=2000", "model.fwd_ms=2", "model.bwd_ms=2")
    try:
        wait_for_step(run_dir, 2, step=3)
        shutil.rmtree(run_dir)
        assert proc.wait(timeout=120) == 1, read_log(log)[-3000:]
    finally:
        end(proc, run_dir)
    out = read_log(log)
    assert "Traceback" not in out, out[-3000:]
    assert re.search(r"ppx: error: rank 0 failed on .*: FileNotFoundError", out), out[-3000:]
    assert f"ppx: run directory (incomplete, removed while the job ran): {run_dir}\n" in out, out[-3000:]
