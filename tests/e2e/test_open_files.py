"""A job out of file descriptors (RLIMIT_NOFILE, `ulimit -n`), run for real: `ppx run` raises a
soft limit too low for the job to what it needs, or refuses in one line before it claims the
run directory; torchrun's agent that fails before it starts a rank (its own OSError, which a
limit below `ppx run`'s check gives) says so in one line, under `ppx run` and under srun, not
in torch's traceback."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys

import pytest

from helpers import REPO
from ppx.launch.open_files import needed

pytestmark = pytest.mark.plain_agent  # how a job starts and ends, as a user's does (tests/conftest.py)

AGENT_FAILED = "torchrun could not start the job: OSError: [Errno 24] Too many open files"

# `ppx run`'s launcher without its check (`ppx.commands.run`): the supervised torchrun job of
# a 2-rank CPU run, forked ranks, as it starts it
SUPERVISED = """
import sys
from pathlib import Path
from ppx.launch import processes
from ppx.launch.supervisor import supervise
run_dir = Path(sys.argv[1])
run_dir.mkdir()
env = processes.worker_env("cpu", 1, "ppx run gpipe_2cpu")
sys.exit(supervise(processes.torchrun_command(2, run_dir, True), env, run_dir, 2, 60))
"""


def _open_files(soft: int, hard: int | None = None):
    """A child's open files held to ``soft`` (its hard limit ``hard``, the same if None)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, soft if hard is None else hard))

    return limit


def _run(cmd: list[str], limit, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, preexec_fn=limit, env=env, capture_output=True, text=True, timeout=180, cwd=REPO)


def _ppx_run(run_dir, limit) -> subprocess.CompletedProcess:
    args = ["gpipe_2cpu", "train.steps=2", f"run.dir={run_dir}", "logging.wandb.mode=disabled"]
    return _run([sys.executable, "-m", "ppx.cli", "run", *args, "logging.report=false"], limit)


def test_a_hard_limit_below_the_jobs_need_is_refused_in_one_line(tmp_path):
    """`ulimit -n 30`: torchrun's traceback and a line without its cause (at 10: two minutes of
    rendezvous timeouts first); now one line before the run directory is claimed."""
    r = _ppx_run(tmp_path / "run", _open_files(30))
    need = needed(2)
    assert (r.returncode, r.stderr) == (
        2,
        f"ppx: error: open files are limited to 30 (ulimit -n; hard limit 30), where a 2-rank job "
        f"needs about {need}: raise both limits to {need} or more\n",
    )
    assert not (tmp_path / "run").exists()


def test_a_soft_limit_below_the_jobs_need_is_raised(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    r = _ppx_run(tmp_path / "run", _open_files(30, hard))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").exists()


def test_torchrun_that_cannot_start_the_job_says_why_in_one_line(tmp_path):
    """The agent out of file descriptors before it starts a rank, under `ppx run`'s launcher:
    torch's traceback, then "the job failed (exit 1); where each rank was: rank 0: not started;
    ..." without the cause; now the agent's one line, the job's cause in incomplete.txt."""
    run_dir = tmp_path / "run"
    r = _run([sys.executable, "-c", SUPERVISED, str(run_dir)], _open_files(30))
    assert (r.returncode, r.stderr.splitlines()) == (
        1,
        [f"ppx: error: {AGENT_FAILED}", f"ppx: run directory (incomplete): {run_dir}"],
    ), r.stderr[-3000:]
    assert (run_dir / "incomplete.txt").read_text().splitlines()[0] == AGENT_FAILED


def test_torchrun_under_srun_that_cannot_start_the_job_says_why_in_one_line(tmp_path):
    """The same agent as slurm/pp.sbatch starts it (PPX_RUN_DIR names the run directory), its
    ranks started, not forked (fewer files: 20 fails it, in its store's socket or a pipe)."""
    env = {k: v for k, v in os.environ.items() if k != "PPX_TORCHRUN_EXITS"}
    env.update(PPX_RUN_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    script = tmp_path / "rank.py"
    script.write_text("print('started')\n")
    cmd = [sys.executable, "-m", "ppx.launch.torchrun", "--standalone", "--nproc-per-node=2", str(script)]
    r = _run(cmd, _open_files(20), env)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.fullmatch(r"torchrun could not start the job: \w+: .*(Too many open files|too many open files)", last)
    assert (tmp_path / "incomplete.txt").read_text() == last + "\n"


def test_a_hard_limit_between_the_floor_and_the_need_runs_with_a_warning(tmp_path):
    """The need is an estimate (a line through three jobs' counts): a hard limit above what a job
    was seen to fail at but below it is taken, with a warning, not refused."""
    r = _ppx_run(tmp_path / "run", _open_files(80))
    assert r.returncode == 0, r.stderr[-3000:]
    warning = (
        "ppx: warning: open files are limited to 80 (ulimit -n, hard limit 80), where a 2-rank job may need about "
        f"{needed(2)}; should a process run out, raise the hard limit"
    )
    assert warning in r.stderr.splitlines() and (tmp_path / "run" / "summary.json").exists()


def test_torchrun_failing_on_an_error_of_no_os_keeps_its_traceback(tmp_path):
    """An agent error other than the OS's or an import's (here torch's ValueError for a process
    count it cannot read) may be a bug of ppx's wrapper: its one line names the traceback kept."""
    env = {k: v for k, v in os.environ.items() if k != "PPX_TORCHRUN_EXITS"}
    (tmp_path / "status").mkdir()
    env.update(PPX_RUN_DIR=str(tmp_path))
    cmd = [sys.executable, "-m", "ppx.launch.torchrun", "--standalone", "--nproc-per-node=two", "rank.py"]
    r = _run(cmd, None, env)
    kept = tmp_path / "status" / "torchrun.traceback"
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.splitlines()[-1].endswith(f"(its traceback: {kept})") and "ValueError" in kept.read_text()
    # a rank (another node's, under srun) failed first and said so: this is its consequence,
    # said nowhere but in incomplete.txt (it printed a second cause beside the first)
    (tmp_path / "status" / "cause.txt").write_text("rank 3 died: killed by signal SIGKILL (9) on 3F0 (step 0)\n")
    (tmp_path / "incomplete.txt").unlink()
    r = _run(cmd, None, env)
    assert r.returncode == 1 and "torchrun" not in r.stderr, r.stderr[-3000:]
    lines = (tmp_path / "incomplete.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchrun could not start the job: ValueError: "), lines


def test_torchrun_under_srun_raises_a_low_soft_limit_itself(tmp_path):
    """No ``ppx run`` checks the limit under srun: the agent raises its soft limit to its ranks'
    need, as far as the hard limit lets it (a soft 30 failed the job as above)."""
    env = {k: v for k, v in os.environ.items() if k != "PPX_TORCHRUN_EXITS"}
    env.update(PPX_RUN_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    script = tmp_path / "rank.py"
    script.write_text("import resource\nprint('limit', resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    cmd = [sys.executable, "-m", "ppx.launch.torchrun", "--standalone", "--nproc-per-node=2", str(script)]
    r = _run(cmd, _open_files(30, resource.getrlimit(resource.RLIMIT_NOFILE)[1]), env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count(f"limit {needed(2)}") == 2, r.stdout
