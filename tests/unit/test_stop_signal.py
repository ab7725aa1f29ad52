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


def test_a_wait_failed_on_a_peer_a_sigterm_ended_names_that_peer(status, capsys):
    """kill -TERM of rank 1 alone: rank 0, not stopped itself, finds its wait failed and names rank 1."""
    _peer(status, 1, "1F3", "stopped")
    dog = Watchdog(0, 30.0, status)
    dog.phase("wait 0RECV_F3 from rank 1", 2)
    report_failure(dog, "rank 0 failed on wait 0RECV_F3 from rank 1 (step 2): Connection closed by peer", peer=1)
    line = "rank 1 died on 1F3 (step 2): a SIGTERM ended it (rank 0 was on wait 0RECV_F3 from rank 1 (step 2))"
    assert capsys.readouterr().err == f"ppx: error: {line}\n"
