"""ppx's torchrun outside `ppx run` (`ppx.launch.torchrun`; under srun PPX_RUN_DIR is set by
slurm/pp.sbatch), run for real: torchrun's own agent starts two ranks of a small script that
fails as a rank can (killed by a signal, exiting 1), or the launcher itself is stopped or cut
from its rendezvous. A rank of its node killed by a signal is named with the action its
status file holds, once for the job; a rank that raised is left to its own line; the run's
incomplete.txt gets what each launcher saw; a launcher stopped by a signal, or cut from its
rendezvous, says so in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO
from helpers.job import process_state
from ppx.launch.heartbeat import beat_path, read_beat
from ppx.launch.watchdog import cause_path, status_path

pytestmark = pytest.mark.plain_agent  # how a job starts and ends, as a user's does (tests/conftest.py)

KILLED = "rank 1 died: killed by signal SIGKILL (9) on 1F3 (step 2)"

RANK = """
import os, signal, sys, time
rank, mode, up = int(os.environ["RANK"]), sys.argv[1], sys.argv[2]
with open(os.path.join(up, f".up{rank}"), "w") as f:  # its pid, whole once the file appears
    f.write(str(os.getpid()))
os.rename(os.path.join(up, f".up{rank}"), os.path.join(up, f"up{rank}"))
if rank == 1 and mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 1 and mode == "raise":
    sys.exit(1)
time.sleep(120)  # until torchrun ends it
"""

BROKEN_STORE = """
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:  # every connection closed at once: the store of a launcher that has ended
    s.accept()[0].close()
"""


@pytest.fixture
def run(tmp_path):
    """A run directory whose rank 1 said it was on 1F3 of step 2."""
    (tmp_path / "status").mkdir()
    status_path(tmp_path / "status", 1).write_text("1F3 (step 2)")
    return tmp_path


def _launcher(tmp_path, mode: str, run_dir=None, *torchrun_args: str) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if k not in ("PPX_RUN_DIR", "PPX_TORCHRUN_EXITS")}
    if run_dir is not None:
        env["PPX_RUN_DIR"] = str(run_dir)
    args = list(torchrun_args) or ["--standalone", "--nproc-per-node=2"]
    cmd = [sys.executable, "-m", "ppx.launch.torchrun", *args, str(script), mode, str(tmp_path)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def _ended(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, list[str]]:
    """The launcher's exit code and its stderr's last lines (torchrun's own logs come before)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err.strip().splitlines()


def test_a_killed_rank_is_named_with_its_action_and_kept_as_the_cause(run):
    code, err = _ended(_launcher(run, "kill", run))
    assert code == 1
    assert err[-1] == f"ppx: error: {KILLED}", err[-5:]
    # torchrun SIGTERMed rank 0 once rank 1 died: a consequence, never named
    assert not any(line.startswith("ppx: error: rank 0") for line in err)
    assert cause_path(run / "status").read_text() == KILLED + "\n"
    assert (run / "incomplete.txt").read_text() == KILLED + "\n"


def test_a_cause_a_peer_named_first_is_not_printed_again(run):
    peer = "rank 1 died on 1F3 (step 2): its process ended (rank 0 was on wait 0RECV_F3 from rank 1 (step 2))"
    cause_path(run / "status").write_text(peer + "\n")
    (run / "incomplete.txt").write_text("what another node's launcher saw\n")
    code, err = _ended(_launcher(run, "kill", run))
    assert code == 1 and not any(line.startswith("ppx: error:") for line in err), err[-5:]
    assert cause_path(run / "status").read_text() == peer + "\n"
    assert (run / "incomplete.txt").read_text() == "what another node's launcher saw\n" + KILLED + "\n"


def test_a_rank_that_raised_is_left_to_its_own_line(run):
    cause_path(run / "status").write_text("rank 1 failed on 1F3 (step 2): RuntimeError: boom\n")
    code, err = _ended(_launcher(run, "raise", run))
    assert code == 1
    # (rank 0, SIGTERMed by torchrun once rank 1 failed, may be listed before it)
    assert err[-1].startswith("torchrun: ") and err[-1].endswith("rank 1: exit code 1"), err[-5:]
    assert not any(line.startswith("ppx: error:") for line in err)
    assert (run / "incomplete.txt").read_text() == "rank 1 failed on 1F3 (step 2): RuntimeError: boom\n"


def test_a_rank_killed_before_its_first_status_says_so(tmp_path):
    (tmp_path / "status").mkdir()
    code, err = _ended(_launcher(tmp_path, "kill", tmp_path))
    assert code == 1
    assert err[-1] == "ppx: error: rank 1 died: killed by signal SIGKILL (9) on start-up (before its first status)"


def test_without_a_run_directory_the_exit_codes_are_listed(run):
    code, err = _ended(_launcher(run, "kill"))
    assert code == 1
    assert err[-1].startswith("torchrun: ") and " failed: " in err[-1], err[-5:]
    assert err[-1].endswith("rank 1: exit code -9 (SIGKILL)"), err[-5:]
    assert not cause_path(run / "status").exists() and not (run / "incomplete.txt").exists()


# SIGUSR1 (a job manager's warning: SLURM's --signal) ended the agent alone, its ranks left running
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_launcher_stopped_by_a_signal_says_so_in_one_line_and_ends_its_ranks(run, sig):
    proc = _launcher(run, "sleep", run)
    deadline = time.monotonic() + 60
    while not all((run / f"up{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int((run / f"up{r}").read_text()) for r in (0, 1)]  # each rank wrote its pid there
    proc.send_signal(sig)
    code, err = _ended(proc)
    assert code == 128 + sig
    assert err[-1] == f"torchrun: stopped by {sig.name}: its ranks were ended", err[-5:]
    time.sleep(0.5)
    left = [pid for pid in pids if process_state(pid) not in ("Z", "gone")]
    assert len(pids) >= 2 and left == []


def test_a_lost_rendezvous_is_one_line_with_its_inner_cause(tmp_path):
    """A node's launcher whose rendezvous store closes every connection (its host launcher
    ended): torchrun's RendezvousConnectionError, said in one line with its inner cause."""
    store = subprocess.Popen([sys.executable, "-c", BROKEN_STORE], stdout=subprocess.PIPE, text=True)
    try:
        port = int(store.stdout.readline())
        rdzv = ["--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
        rdzv += ["--rdzv-id=ppx-test", "--rdzv-conf=read_timeout=3,timeout=3", "--nproc-per-node=1"]
        code, err = _ended(_launcher(tmp_path, "sleep", None, *rdzv), timeout=90)
    finally:
        store.kill()
        store.wait()
    assert code == 1
    assert err[-1].startswith("torchrun: The connection to the C10d store has failed."), err[-5:]
    assert err[-1].endswith("; if the launcher holding it ended, its node's output says why")
    assert "(" in err[-1]  # its inner cause, in brackets


def _ppx_job(tmp_path):
    """ppx's torchrun running two ``ppx run`` ranks past their first steps: (it, their beats)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PPX_RUN_DIR", "PPX_TORCHRUN_EXITS")}
    run = tmp_path / "run"
    job = ["-m", "ppx.cli", "run", "1f1b_2cpu", "model.hidden=16", "train.steps=100000", f"run.dir={run}"]
    cmd = [sys.executable, "-m", "ppx.launch.torchrun", "--standalone", "--nproc-per-node=2", *job]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _steps(run) < 3 and proc.poll() is None and time.monotonic() < deadline:  # (past the store's last use)
        time.sleep(0.1)
    beats = [read_beat(beat_path(run / "status", r), r) for r in (0, 1)]
    if not all(beats):
        proc.kill()
    assert all(beats), (beats, proc.communicate()[1][-2000:])
    return proc, beats


def _left(beats) -> list[str]:
    """The states of the ranks still running, waited for up to 10 s."""
    deadline = time.monotonic() + 10
    while any(process_state(b.pid) not in ("Z", "gone") for b in beats) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [process_state(b.pid) for b in beats if process_state(b.pid) not in ("Z", "gone")]


def test_ppx_ranks_end_with_their_killed_launcher(tmp_path):
    """``ppx run`` ranks a torchrun started (srun's, a user's own) follow their agent: one
    killed (SIGKILL, which it cannot pass on) leaves none running (they trained on to their
    last step)."""
    proc, beats = _ppx_job(tmp_path)
    proc.kill()
    proc.communicate()
    assert _left(beats) == []


def test_a_warning_to_every_process_of_the_job_is_the_launchers_to_act_on(tmp_path):
    """SLURM may send its warning (SIGUSR1) to every process of a step: the ranks leave it to
    their launcher, which ends them and says so (killed by it, they were named as a failure)."""
    proc, beats = _ppx_job(tmp_path)
    for pid in (proc.pid, *(b.pid for b in beats)):
        os.kill(pid, signal.SIGUSR1)
    code, err = _ended(proc)
    assert code == 128 + signal.SIGUSR1 and err[-1] == "torchrun: stopped by SIGUSR1: its ranks were ended", err[-5:]
    assert not any("SIGUSR1 (10)" in line for line in err), err[-5:]
    assert _left(beats) == []


def _steps(run) -> int:
    try:
        return (run / "metrics.jsonl").read_text().count("\n")
    except OSError:
        return 0
