"""Heartbeats (ppx/launch/heartbeat.py) and how the launcher's supervisor explains a failed job
(ppx/launch/supervisor.py), without processes: the e2e tests in test_failures.py freeze, kill
and stop real ones."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
import threading
import time

import pytest

from ppx.launch.heartbeat import (
    Heartbeat,
    beat_path,
    note_gone,
    pid_namespace,
    read_beat,
    read_beats,
    silent_peers_elsewhere,
    stale_peers,
    stopped_responding,
    this_host,
)
from ppx.launch.stops import stops_held
from ppx.launch.supervisor import Supervisor, supervise


@pytest.mark.timing
def test_a_heartbeat_moves_until_stopped_then_says_done(tmp_path):
    beat = Heartbeat(tmp_path, 3, interval_s=0.05).start()
    first = read_beat(beat_path(tmp_path, 3), 3)
    time.sleep(0.3)
    later = read_beat(beat_path(tmp_path, 3), 3)
    beat.stop()
    done = read_beat(beat_path(tmp_path, 3), 3)
    assert first.pid == os.getpid() and first.state == "alive"
    assert later.count > first.count and abs(later.wall - time.time()) < 5
    assert done.state == "done"
    assert len(beat_path(tmp_path, 3).read_bytes()) == 128  # rewritten in place, one padded line


@pytest.mark.timing
def test_stale_peers_are_the_silent_live_ones_other_than_me(tmp_path):
    live = Heartbeat(tmp_path, 0, interval_s=0.05).start()
    for rank in (1, 3):  # beats once and no more: frozen; rank 3 is the reader itself
        beat_path(tmp_path, rank).write_text(f"{os.getpid()} host 1 {time.time():.1f} alive")
    ended = Heartbeat(tmp_path, 2)
    ended.start()
    ended.stop()
    (tmp_path / "rank9.beat").write_text("garbage")  # caught mid-write: no news, no error
    try:
        stale = stale_peers(tmp_path, me=3, window_s=0.3)
    finally:
        live.stop()
    assert [b.rank for b in stale] == [1]
    assert sorted(read_beats(tmp_path)) == [0, 1, 2, 3]
    assert stale_peers(tmp_path / "absent", me=0, window_s=0.01) == []


def _beat_from(tmp_path, rank: int, host: str, state: str = "alive", count: int = 7, age_s: float = 0.0) -> None:
    """A beat of a rank on ``host`` (in this pid namespace), as its Heartbeat writes it,
    ``age_s`` seconds ago."""
    line = f"4242 {host} {count} {time.time() - age_s:.1f} {state} {pid_namespace()}"
    beat_path(tmp_path, rank).write_text(line.ljust(127) + "\n")


@pytest.mark.timing
def test_silent_peers_elsewhere_are_the_live_ones_on_other_nodes_whose_beat_stopped(tmp_path):
    _beat_from(tmp_path, 1, "node-b")  # another node, silent: its process ended
    _beat_from(tmp_path, 2, this_host())  # this node, silent: frozen (its pid can be looked up)
    _beat_from(tmp_path, 3, "node-b", "done")  # another node, ended on its own
    stop = threading.Event()

    def beating() -> None:  # another node, beating
        for count in itertools.count():
            _beat_from(tmp_path, 4, "node-c", count=count)
            if stop.wait(0.05):
                return

    thread = threading.Thread(target=beating)
    thread.start()
    try:
        assert [b.rank for b in silent_peers_elsewhere(tmp_path, me=0, window_s=0.3)] == [1]
        assert silent_peers_elsewhere(tmp_path, me=1, window_s=0.3) == []  # (rank 1 reading: itself)
    finally:
        stop.set()
        thread.join()


def test_with_no_peer_on_another_node_nothing_is_waited_for(tmp_path):
    _beat_from(tmp_path, 1, this_host())
    start = time.monotonic()
    assert silent_peers_elsewhere(tmp_path, me=0, window_s=5.0) == []
    assert time.monotonic() - start < 1.0


@pytest.mark.timing
def test_a_peer_killed_on_another_node_is_named_by_the_rank_whose_wait_failed(tmp_path, capsys, monkeypatch):
    """Under srun (no `ppx run`): rank 1 on node-b was killed on 1B1, rank 0's wait on it failed
    on the closed connection. Its pid cannot be looked up from here, its heartbeat can."""
    from ppx.launch.failure_line import report_failure
    from ppx.launch.watchdog import Watchdog, cause_path, read_status, status_path

    monkeypatch.delenv("PPX_LAUNCHER_PID", raising=False)
    status = tmp_path / "status"
    dog1 = Watchdog(1, 30.0, status)
    dog1.phase("1B1", 0)
    _beat_from(status, 1, "node-b")
    dog0 = Watchdog(0, 30.0, status)
    dog0.phase("wait 0RECV_B1 from rank 1", 0)
    report_failure(dog0, "rank 0 failed at step 0 on wait 0RECV_B1 from rank 1: Connection closed by peer", peer=1)
    line = "rank 1 died on 1B1 (step 0): its heartbeat stopped (rank 0 was on wait 0RECV_B1 from rank 1 (step 0))"
    assert capsys.readouterr().err == f"ppx: error: {line}\n"
    assert cause_path(status).read_text() == line + "\n"
    assert read_status(status_path(status, 0)) == "failed on wait 0RECV_B1 from rank 1 (step 0)"


def _failed_wait_reported(tmp_path, peers: dict[int, tuple[str, float]], waited_on: int | None) -> str:
    """Rank 0's line when its wait on ``waited_on`` failed, with ``peers`` (rank -> (its
    action, how long ago its last beat)) silent on node-b."""
    from ppx.launch.failure_line import report_failure
    from ppx.launch.watchdog import Watchdog

    status = tmp_path / "status"
    for rank, (action, age_s) in peers.items():
        Watchdog(rank, 30.0, status).phase(action, 0)
        _beat_from(status, rank, "node-b", age_s=age_s)
    dog0 = Watchdog(0, 30.0, status)
    dog0.phase(f"wait 0RECV_B1 from rank {waited_on}", 0)
    own = f"rank 0 failed at step 0 on wait 0RECV_B1 from rank {waited_on}: RuntimeError: gloo"
    report_failure(dog0, own, peer=waited_on)
    return (status / "cause.txt").read_text().rstrip("\n")


@pytest.mark.timing
def test_a_peer_on_another_node_frozen_long_before_the_wait_failed_is_named_as_frozen(tmp_path, monkeypatch):
    """gloo's timeout (30 s or more) can end a wait on a frozen peer before the watchdog does:
    a silent beat that old is a freeze, not a death at the failure."""
    monkeypatch.delenv("PPX_LAUNCHER_PID", raising=False)
    got = _failed_wait_reported(tmp_path, {1: ("1B1", 62.0)}, 1)
    assert re.fullmatch(
        r"rank 1 stopped responding \(no heartbeat for 6\d\.\d s\); it was on 1B1 \(step 0\) "
        r"\(seen by rank 0, failed on wait 0RECV_B1 from rank 1 \(step 0\)\)",
        got,
    ), got


@pytest.mark.timing
@pytest.mark.parametrize("waited_on,named", [(3, 3), (None, 2)])
def test_of_several_silent_peers_the_one_waited_on_is_named_else_the_first_silent(
    tmp_path, monkeypatch, waited_on, named
):
    """A launcher ends a killed rank's neighbours after it: the rank the failed wait was on is
    the cause; without one, the peer whose beat stopped first."""
    monkeypatch.delenv("PPX_LAUNCHER_PID", raising=False)
    got = _failed_wait_reported(tmp_path, {2: ("2F3", 1.5), 3: ("3B1", 0.5)}, waited_on)
    assert got.startswith(f"rank {named} died on {named}"), got


def test_the_line_naming_a_frozen_rank():
    assert (
        stopped_responding(2, 8.04, "2F3 (step 4)") == "rank 2 stopped responding (no heartbeat for 8.0 s); it was on "
        "2F3 (step 4)"
    )


def supervisor(tmp_path, world: int = 2) -> Supervisor:
    (tmp_path / "status").mkdir()
    return Supervisor(["true"], {}, tmp_path, world, timeout_s=5)


def test_a_rank_killed_by_a_signal_is_named_with_it_and_its_action(tmp_path, capsys):
    sup = supervisor(tmp_path)
    (tmp_path / "status" / "torchrun.json").write_text(
        json.dumps({"0": {"exitcode": 1, "pid": 10}, "1": {"exitcode": -9, "pid": 11}})
    )
    (tmp_path / "status" / "rank1.txt").write_text("1B2 (step 10)" + " " * 40 + "\n")
    assert sup._failed(1) == 1
    err = capsys.readouterr().err
    assert err == (
        "ppx: error: rank 1 died: killed by signal SIGKILL (9) on 1B2 (step 10)\n"
        f"ppx: run directory (incomplete): {tmp_path}\n"
    )
    assert (tmp_path / "incomplete.txt").read_text() == "rank 1 died: killed by signal SIGKILL (9) on 1B2 (step 10)\n"


@pytest.mark.parametrize("evidence", ["none", "seen first", "found gone"])
def test_a_sigterm_is_a_cause_only_where_torchrun_did_not_send_it(tmp_path, capsys, evidence):
    """torchrun SIGTERMs the survivors once it has seen one rank fail, and ppx's fork hook adds
    them to its failures (exit -15, not first): no cause. A plain `kill` of a rank is one:
    torchrun saw it first, or a failing peer found its process gone (gone.txt)."""
    sup = supervisor(tmp_path, world=3)
    failed = {"0": {"exitcode": 1, "pid": 10, "first": evidence != "seen first"}}
    failed["1"] = {"exitcode": -15, "pid": 11, "first": evidence == "seen first"}
    failed["2"] = {"exitcode": -15, "pid": 12, "first": False}  # (torchrun's own SIGTERM, in each case)
    (tmp_path / "status" / "torchrun.json").write_text(json.dumps(failed))
    if evidence == "found gone":
        note_gone(tmp_path / "status", [1])
    (tmp_path / "status" / "rank1.txt").write_text("step start (step 7)\n")
    assert sup._failed(1) == 1
    err = capsys.readouterr().err.splitlines()
    if evidence == "none":
        assert err[0].startswith("ppx: error: the job failed (exit 1); where each rank was: ")
    else:
        assert err[0] == "ppx: error: rank 1 died: killed by signal SIGTERM (15) on step start (step 7)"
    assert "rank 2 died" not in "\n".join(err)


def test_torchrun_killed_itself_is_named_so(tmp_path, capsys):
    """torchrun's agent ended by a signal (kill -9 of it) before any rank failed: not "the job failed"."""
    sup = supervisor(tmp_path)
    (tmp_path / "status" / "rank0.txt").write_text("0F1 (step 3)\n")
    assert sup._failed(-9) == 137
    assert capsys.readouterr().err.splitlines()[0] == (
        "ppx: error: torchrun, which runs the ranks, was killed by signal SIGKILL (9); where each rank was: "
        "rank 0: 0F1 (step 3); rank 1: not started"
    )


@pytest.mark.parametrize("cause", [False, True])
def test_torchrun_stopped_by_a_signal_is_named_so_unless_a_rank_failed_first(tmp_path, capsys, cause):
    """torchrun catches SIGTERM and returns 143: with no rank failed, that is its own stop; a
    rank's cause line, where one failed first, stands instead."""
    sup = supervisor(tmp_path)
    if cause:
        (tmp_path / "status" / "cause.txt").write_text("rank 1 failed on 1F0 (step 0): RuntimeError: boom\n")
    assert sup._failed(143) == 143
    err = capsys.readouterr().err
    assert ("torchrun, which runs the ranks, was stopped by signal SIGTERM (15); " in err) is not cause, err
    if cause:
        assert (tmp_path / "incomplete.txt").read_text().startswith("rank 1 failed on 1F0 (step 0)")


def test_a_failure_without_a_signal_says_where_each_rank_was(tmp_path, capsys):
    sup = supervisor(tmp_path)
    (tmp_path / "status" / "rank0.txt").write_text("wait 0RECV_F2 from rank 1 (step 0)\n")
    assert sup._failed(1) == 1  # no torchrun.json: torchrun itself failed, or exit codes >0 only
    err = capsys.readouterr().err
    assert err.startswith(
        "ppx: error: the job failed (exit 1); where each rank was: rank 0: wait 0RECV_F2 from rank 1 (step 0); "
        "rank 1: not started\n"
    )


def test_the_first_failure_is_the_cause_and_the_launcher_keeps_it_with_where_each_rank_was(tmp_path, capsys):
    """The first rank to fail keeps its line (and prints it); a rank failing after it, its
    peer gone, does not; the launcher then prints nothing more than the run directory and
    keeps the cause and where each rank was in incomplete.txt."""
    from ppx.launch.watchdog import claim_cause

    sup = supervisor(tmp_path)
    status = tmp_path / "status"
    assert claim_cause(status, "rank 1 made no progress for 6.1 s on 1F2 (step 0)") is True
    assert claim_cause(status, "rank 0 failed at step 0 on wait 0RECV_B0 from rank 1: RuntimeError: closed") is False
    assert claim_cause(None, "no status folder: every failure speaks") is True
    (status / "rank0.txt").write_text("failed on wait 0RECV_B0 from rank 1 (step 0)\n")
    (status / "rank1.txt").write_text("1F2 (step 0)\n")
    assert sup._failed(1) == 1
    assert capsys.readouterr().err == f"ppx: run directory (incomplete): {tmp_path}\n"
    assert (tmp_path / "incomplete.txt").read_text().splitlines() == [
        "rank 1 made no progress for 6.1 s on 1F2 (step 0)",
        "the job failed (exit 1); where each rank was: rank 0: failed on wait 0RECV_B0 from rank 1 (step 0); "
        "rank 1: 1F2 (step 0)",
    ]


def test_launchers_of_two_nodes_that_saw_only_the_cause_write_it_once(tmp_path):
    """Under srun each node's launcher appends what it saw to incomplete.txt: the job's cause,
    seen by both (the killed rank's node named it; the other node's ranks exited after it), is
    one line, and a line of its own is added."""
    from ppx.launch.supervisor import write_incomplete

    cause = "rank 0 died: killed by signal SIGKILL (9) on 0F3 (step 2)"
    write_incomplete(tmp_path, [cause], append=True)
    write_incomplete(tmp_path, [cause], append=True)
    assert (tmp_path / "incomplete.txt").read_text() == cause + "\n"
    write_incomplete(tmp_path, ["torchrun: ppx.cli failed: rank 1: exit code 1"], append=True)
    assert (tmp_path / "incomplete.txt").read_text().splitlines() == [
        cause,
        "torchrun: ppx.cli failed: rank 1: exit code 1",
    ]
    write_incomplete(tmp_path, ["stopped"])  # (not appending: the file is this line)
    assert (tmp_path / "incomplete.txt").read_text() == "stopped\n"


def test_a_set_up_phase_outlasts_a_short_timeout_and_the_next_phase_does_not(tmp_path):
    """Building the model (CUDA's first calls, NCCL's first collective) is allowed at least
    SETUP_FLOOR_S: a 0.3 s timeout does not end the job 2 s into the build, and does end it
    once the steps have begun, naming the phase."""
    import subprocess
    import sys

    code = (
        "import time\n"
        "from ppx.launch.watchdog import Watchdog\n"
        f"dog = Watchdog(0, 0.3, {str(tmp_path / 'status')!r}, poll_s=0.02).start()\n"
        "dog.phase('building the model', setup=True)\n"
        "time.sleep(2.0)\n"
        "print('built', flush=True)\n"
        "dog.phase('step start', 0)\n"
        "time.sleep(30)\n"
    )
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t
    assert r.returncode == 3 and r.stdout == "built\n", (r.stdout, r.stderr)
    got = re.fullmatch(
        r"ppx: error: rank 0 made no progress for (\d+\.\d) s on step start \(step 0\); ending the job "
        r"\(runtime\.timeout_s=0\.3\)\n",
        r.stderr,
    )
    # (0.3 s and the watchdog's 1 s grace, or later where a loaded machine woke its thread late)
    assert got and float(got.group(1)) >= 1.25, r.stderr
    assert took < 20  # ended by the watchdog, not by the 30 s sleep


def test_where_each_rank_was_is_unknown_not_not_started_when_status_is_gone(tmp_path, capsys):
    """The run directory removed under a running job: its ranks had started, and no status says where."""
    sup = supervisor(tmp_path)
    (tmp_path / "status").rmdir()
    assert sup._failed(1) == 1
    err = capsys.readouterr().err
    assert f"where each rank was: unknown ({tmp_path / 'status'} is gone)" in err and "not started" not in err


def test_a_stop_between_the_claim_and_the_job_is_held_and_marks_the_run(tmp_path, capsys):
    """SIGTERM to ``ppx run`` just after it claimed its run directory ended it there, the folder
    left without incomplete.txt: held (`stops_held`), the job is not started and the run says so."""
    before = signal.getsignal(signal.SIGTERM)
    marker = tmp_path / "started"
    with stops_held() as early:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # (the handler runs in this thread, at once)
        assert early == [signal.SIGTERM]
        code = supervise([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], {}, tmp_path, 2, 5.0, early)
    assert code == 128 + signal.SIGTERM and not marker.exists()
    assert signal.getsignal(signal.SIGTERM) is before
    assert (tmp_path / "incomplete.txt").read_text() == (
        "stopped: ppx run received SIGTERM after 0.0 s and ended the job; "
        "where each rank was: rank 0: not started; rank 1: not started\n"
    )
    assert (
        capsys.readouterr().err
        == f"ppx: stopped by SIGTERM: the job was ended; run directory (incomplete): {tmp_path}\n"
    )
