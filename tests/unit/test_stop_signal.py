"""Who a rank names when a SIGTERM stops it (`ppx.launch.stop_signal`) and when its wait on a
stopped peer fails: a killed peer, yes; a peer a SIGTERM stopped with it, no."""

from __future__ import annotations

import subprocess

import pytest

from ppx.launch.failure_line import name_dead_peer, report_failure
from ppx.launch.heartbeat import beat_path, pid_namespace, read_beat, this_host
from ppx.launch.watchdog import Watchdog, cause_path


def _reaped() -> int:
    """A pid of this machine whose process has ended (and been reaped)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _peer(status, rank: int, action: str, state: str) -> None:
    """Rank ``rank`` of this machine, on ``action`` at step 2, its process ended, its last beat ``state``."""
    Watchdog(rank, 30.0, status).phase(action, 2)
    line = f"{_reaped()} {this_host()} 7 0.0 {state} {pid_namespace()}"
    beat_path(status, rank).write_text(line.ljust(127) + "\n")


@pytest.fixture
def status(tmp_path, monkeypatch):
    monkeypatch.delenv("PPX_LAUNCHER_PID", raising=False)  # a torchrun of the user's: no ppx run
    return tmp_path / "status"


def test_a_stopped_rank_names_a_killed_peer_and_says_it_was_stopped(status, capsys):
    _peer(status, 1, "1B1", "alive")  # killed: it never said "done" nor "stopped"
    dog = Watchdog(0, 30.0, status)
    dog.phase("0B0", 2)
    assert name_dead_peer(dog)
    line = "rank 1 died on 1B1 (step 2): its process ended (rank 0 was on 0B0 (step 2))"
    assert capsys.readouterr().err == f"ppx: error: {line}\n"
    assert cause_path(status).read_text() == line + "\n"
    assert read_beat(beat_path(status, 0), 0).state == "stopped"


def test_ranks_stopped_together_name_nobody(status, capsys):
    _peer(status, 1, "1F3", "stopped")  # scancel: rank 1 got its SIGTERM too, and said so
    dog = Watchdog(0, 30.0, status)
    dog.phase("0F4", 2)
    assert not name_dead_peer(dog)
    assert capsys.readouterr().err == "" and not cause_path(status).exists()


def test_a_cause_already_claimed_is_not_claimed_again(status, capsys):
    _peer(status, 1, "1B1", "alive")
    cause_path(status).write_text("rank 2 failed on 2F0 (step 2): ValueError\n")
    assert name_dead_peer(Watchdog(0, 30.0, status))
    assert capsys.readouterr().err == ""


def test_a_stopped_rank_whose_wait_failed_on_a_peer_stopped_with_it_says_nothing(status, capsys):
    """scancel: this rank's SIGTERM came (STOPPED), and its wait failed on a peer stopped too:
    no line (neither the peer's nor its own wait's), its status saying where it stopped."""
    from ppx.launch.failure_line import STOPPED
    from ppx.launch.watchdog import read_status, status_path

    _peer(status, 1, "1F3", "stopped")
    dog = Watchdog(0, 30.0, status)
    dog.phase("wait 0RECV_F3 from rank 1", 2)
    STOPPED.set()
    try:
        report_failure(dog, "rank 0 failed on wait 0RECV_F3 from rank 1 (step 2): Connection closed by peer", peer=1)
    finally:
        STOPPED.clear()
    assert capsys.readouterr().err == "" and not cause_path(status).exists()
    assert read_status(status_path(status, 0)) == "stopped on wait 0RECV_F3 from rank 1 (step 2)"


def test_a_wait_failed_on_a_peer_a_sigterm_ended_names_that_peer(status, capsys):
    """kill -TERM of rank 1 alone: rank 0, not stopped itself, finds its wait failed and names rank 1."""
    _peer(status, 1, "1F3", "stopped")
    dog = Watchdog(0, 30.0, status)
    dog.phase("wait 0RECV_F3 from rank 1", 2)
    report_failure(dog, "rank 0 failed on wait 0RECV_F3 from rank 1 (step 2): Connection closed by peer", peer=1)
    line = "rank 1 died on 1F3 (step 2): a SIGTERM ended it (rank 0 was on wait 0RECV_F3 from rank 1 (step 2))"
    assert capsys.readouterr().err == f"ppx: error: {line}\n"


FOLLOWED = """
import os, signal, sys, time
from ppx.launch import stop_signal
from ppx.launch.watchdog import Watchdog
if sys.argv[2] == "fd-taken":
    r, w = os.pipe(); os.set_blocking(w, False); signal.set_wakeup_fd(w)
if sys.argv[2] == "raises":
    def broken(watchdog):
        raise BrokenPipeError("stderr's reader is gone")
    stop_signal.name_dead_peer = broken
dog = Watchdog(0, 30.0, sys.argv[1]).start()
dog.phase("0F3", 2)
followed = stop_signal.follow_stop_signal(dog)
expected = w if sys.argv[2] == "fd-taken" else stop_signal._pipe[1] if stop_signal._pipe else -1
now = signal.set_wakeup_fd(-1)  # (the wakeup fd: ours, theirs kept, or none; set again before the line)
if now != -1:
    signal.set_wakeup_fd(now, warn_on_full_buffer=False)
print(followed, now == expected, flush=True)
if sys.argv[2] == "fork":
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # (its fork handlers have run: a SIGTERM before them would reach the rank's pipe)
        os.write(ready_w, b"1")
        time.sleep(30)
        os._exit(0)
    os.read(ready_r, 1)
    os.kill(child, signal.SIGTERM)
    print("child", os.waitpid(child, 0)[1] == signal.SIGTERM, flush=True)
    time.sleep(1)
    print("parent alive", flush=True)
time.sleep(30)  # in Python's sleep: only the thread can end it within the test's time
"""


def _followed(tmp_path, how: str, env=None) -> tuple[subprocess.CompletedProcess, float]:
    """FOLLOWED run as ``how``, SIGTERMed once it printed its first line: (it, seconds to its end)."""
    import os
    import signal
    import sys
    import time

    from helpers import REPO

    proc = subprocess.Popen(
        [sys.executable, "-c", FOLLOWED, str(tmp_path), how],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    first = proc.stdout.readline()
    if how == "fork":
        first += proc.stdout.readline() + proc.stdout.readline()
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, first + out, err), time.monotonic() - sent


@pytest.mark.parametrize("how", ["plain", "raises"])
def test_a_followed_sigterm_ends_the_rank_by_it_at_once(tmp_path, how):
    """Mid-sleep, with no peer gone (or the naming failing: stderr's reader gone): the rank ends
    by SIGTERM within a second, its heartbeat saying "stopped", and no line."""
    r, took = _followed(tmp_path, how)
    assert r.stdout.startswith("True True"), r.stdout + r.stderr
    assert r.returncode == -15 and took < 10, (r.returncode, took, r.stderr)
    if how == "plain":
        assert r.stderr == "" and read_beat(beat_path(tmp_path, 0), 0).state == "stopped"


def test_sigterm_is_left_alone_where_a_launcher_or_another_owner_has_it(tmp_path):
    """Under ppx run (PPX_LAUNCHER_PID alive), under ppx's srun wrapper (PPX_RUN_DIR), or with
    another wakeup fd set (kept as it was): not followed; SIGTERM ends the process as ever."""
    import os

    for env, how in (
        ({"PPX_LAUNCHER_PID": str(os.getpid())}, "plain"),
        ({"PPX_RUN_DIR": "x"}, "plain"),
        ({}, "fd-taken"),
    ):
        r, took = _followed(tmp_path, how, env)
        assert r.stdout.startswith("False True"), (env, how, r.stdout, r.stderr)
        assert r.returncode == -15 and took < 10


def test_a_process_the_rank_forks_ends_by_its_own_sigterm(tmp_path):
    """A DataLoader's worker, forked from a rank: SIGTERM ends it, and not its rank."""
    r, _ = _followed(tmp_path, "fork")
    assert "child True" in r.stdout and "parent alive" in r.stdout, r.stdout + r.stderr
    assert r.returncode == -15


STOPPED_THEN_FAILED = """
import os, signal, sys, threading
from ppx.launch import stop_signal
from ppx.launch.failure_line import STOPPED, report_failure
from ppx.launch.watchdog import Watchdog
held = threading.Event()
if sys.argv[2] == "thread-late":  # the thread not yet run when the main thread's wait fails
    follow = stop_signal._follow
    stop_signal._follow = lambda fd, dog: (held.wait(), follow(fd, dog))
dog = Watchdog(0, 30.0, sys.argv[1]).start()
dog.phase("wait 0RECV_F3 from rank 1", 2)
assert stop_signal.follow_stop_signal(dog)
os.kill(os.getpid(), signal.SIGTERM)
print("stopped", STOPPED.is_set(), flush=True)  # (the main thread's own handler ran, whatever the thread did)
report_failure(dog, "rank 0 failed on wait 0RECV_F3 from rank 1 (step 2): Connection closed by peer", peer=1)
held.set()
stop_signal.await_stop()
sys.exit(1)  # the rank's own code, were it not ended by its SIGTERM first
"""


@pytest.mark.parametrize("how", ["thread-late", "plain"])
def test_a_rank_stopped_before_its_wait_failed_blames_no_stopped_peer_and_ends_by_the_sigterm(status, how):
    """scancel on a loaded machine: this rank's SIGTERM came and its thread has not run yet (or
    has) when its wait fails on a peer that a SIGTERM stopped: no line blames the peer, and the
    rank ends by its SIGTERM, not by its own exit code."""
    import sys

    from helpers import REPO
    from ppx.launch.watchdog import read_status, status_path

    _peer(status, 1, "1F3", "stopped")
    r = subprocess.run(
        [sys.executable, "-c", STOPPED_THEN_FAILED, str(status), how],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # (plain: the thread may end the rank before its main thread prints, on a loaded machine)
    assert r.stdout.startswith("stopped True") or (how == "plain" and r.stdout == ""), r.stdout + r.stderr
    assert "ppx: error" not in r.stderr and not cause_path(status).exists(), r.stderr
    assert r.returncode == -15, (r.returncode, r.stderr)
    # where the main thread made its line first it says it stopped there; where the thread ended
    # the rank first (plain, mostly), the action it was on
    where = read_status(status_path(status, 0))
    assert where == "stopped on wait 0RECV_F3 from rank 1 (step 2)" or (
        how == "plain" and where == "wait 0RECV_F3 from rank 1 (step 2)"
    )
