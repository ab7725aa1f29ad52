"""``ppx run``'s watch over its torchrun job: it starts torchrun in a session of its own and,
until the job ends,

- watches every rank's heartbeat (`ppx.launch.heartbeat`): a rank whose process is still
  there but whose heartbeat has not moved for ``runtime.timeout_s`` is frozen (SIGSTOP, a
  stuck machine). It prints one line naming the rank and where it was, and ends the job:
  torchrun stopped, every worker stopped, SIGKILL to the frozen rank, SIGTERM then SIGCONT
  to the others, SIGKILL to what is left after ``GRACE_S`` (torchrun's own grace is 30 s),
  then to torchrun's process group;
- forwards the stop signals (`ppx.launch.stops`: a ``timeout``, a job manager, Ctrl-C) sent to
  ``ppx run`` the same way, then exits 128 + the signal (143 for SIGTERM, 130 for SIGINT);
- ends the job when every rank has ended and torchrun has not (its agent frozen) for
  ``runtime.timeout_s`` (a failed run's: at least ``UNREAPED_S``): the run kept where it completed, else how each rank ended (its exit
  status, read from /proc while torchrun has not reaped it) or its own line;
- once torchrun has ended on its own with an error, explains it: a rank killed by a signal
  (torchrun's exit codes, `ppx.launch.torchrun`) "died: killed by signal SIGKILL (9)" on the
  action its status file names; otherwise the rank that failed first has said why in its own
  line (``status/cause.txt``), and incomplete.txt keeps that line and where each rank was
  (printed only where no rank said anything).

Every way the job ends without completing leaves ``<run>/incomplete.txt`` saying why, and a
last line naming the run directory. Started workers run in sessions of their own (torchrun
starts them so), so each one is signalled as its process group; forked ones (CPU runs) share
torchrun's and are signalled alone. They are found in /proc by their command line, orphans
included: ``ppx.launch.worker <run dir>``, or torchrun's own with the forked worker's file
(`ppx.launch.forked_worker`) in any process but torchrun.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ppx.launch.crash_stacks import stacks_note
from ppx.launch.heartbeat import INTERVAL_S, read_beats, read_gone, stopped_responding
from ppx.launch.processes import forked_worker_path, process_alive, zombie_status
from ppx.launch.served_agent import ServedAgent, start_agent
from ppx.launch.stops import STOP_SIGNALS, stops_handled, take
from ppx.launch.watchdog import cause_path, read_status, status_path

GRACE_S = 2.0  # between SIGTERM and SIGKILL when the launcher ends a job
# every rank ended, the run incomplete, torchrun still there: a frozen agent past this (a live
# one reaps its ranks, writes torchrun.json and exits within seconds, on a loaded machine too)
UNREAPED_S = 10.0
POLL_S = 0.25
FORKED = forked_worker_path().encode()


def supervise(command: list[str], env: dict, run_dir: Path, world: int, timeout_s: float, early=()) -> int:
    """Run the torchrun ``command`` to its end, or end it; returns ``ppx run``'s exit code.
    ``early``: stop signals received since the run directory was claimed (`stops.stops_held`): the
    job is then not started, and the run says so as a stopped one does."""
    return Supervisor(command, env, Path(run_dir), world, timeout_s).run(early)


class Supervisor:
    def __init__(self, command: list[str], env: dict, run_dir: Path, world: int, timeout_s: float):
        self.command, self.run_dir, self.world, self.timeout_s = command, run_dir, world, timeout_s
        self.status = run_dir / "status"
        self.exits = self.status / "torchrun.json"
        self.env = dict(env, PPX_LAUNCHER_PID=str(os.getpid()), PPX_TORCHRUN_EXITS=str(self.exits))
        self._seen: dict[int, tuple] = {}  # rank -> its last beat's (pid, count, state)
        self._moved: dict[int, float] = {}  # rank -> when that beat was first seen (monotonic)
        self._signal: int | None = None
        self._done_at: float | None = None  # when every rank was first seen done with the run complete
        self.proc: subprocess.Popen | ServedAgent | None = None

    def run(self, early=()) -> int:
        self.status.mkdir(parents=True, exist_ok=True)
        with stops_handled(self._on_signal):
            try:
                self.started = time.monotonic()
                if early:  # (stopped before the job started: nothing to end)
                    return report_stop(self.run_dir, take(early), 0.0, self._where_each(), False)
                self.proc = start_agent(self.command, self.env, stopped=lambda: self._signal is not None)
                if self.proc is None:  # (stopped while a server was asked for the agent: none started)
                    return report_stop(self.run_dir, self._signal, 0.0, self._where_each(), False)
                return self._watch()
            finally:
                if self.proc is not None and self.proc.poll() is None:  # an exception in the launcher
                    self._end_job()

    def _on_signal(self, signum, frame) -> None:
        if self._signal is None:
            self._signal = signum

    def _watch(self) -> int:
        while True:
            if self._signal is not None:
                return self._stopped(self._signal)
            code = self.proc.poll()
            if code is not None:
                return 0 if code == 0 else self._failed(code)
            beats = read_beats(self.status)  # (once a poll, for both questions)
            frozen = self._frozen(beats)
            if frozen:
                return self._end_frozen(frozen)
            complete = self._complete(beats)
            if complete or self._all_ended(beats):  # torchrun's agent has had its time to reap the ranks and go
                now = time.monotonic()
                self._done_at = self._done_at or now
                if complete and now - self._done_at > max(self.timeout_s, 3 * INTERVAL_S):
                    return self._end_lingering(now - self._done_at)
                if not complete and now - self._done_at > max(self.timeout_s, UNREAPED_S):
                    return self._end_unreaped(beats, now - self._done_at)
            else:
                self._done_at = None
            try:
                self.proc.wait(timeout=POLL_S)  # (back as soon as torchrun ends, not at the next look)
            except subprocess.TimeoutExpired:
                pass

    def _complete(self, beats: dict) -> bool:
        """Every rank has ended on its own (``beats``: `read_beats`'s) and the run wrote its summary."""
        return (
            len(beats) >= self.world
            and all(b.state == "done" for b in beats.values())
            and (self.run_dir / "summary.json").exists()
        )

    def _end_lingering(self, after_s: float) -> int:
        """The run completed but torchrun did not end (its agent frozen, say): end it, the run kept."""
        self._end_job()
        print(
            f"ppx: torchrun had not ended {after_s:.1f} s after every rank finished; it was ended "
            f"(the run is complete: {self.run_dir})",
            file=sys.stderr,
            flush=True,
        )
        return 0

    def _all_ended(self, beats: dict) -> bool:
        """Every rank has beaten and none of their processes runs now (ended, or a zombie that
        torchrun's agent, frozen, neither reaps nor reports)."""
        return len(beats) >= self.world and not any(self._ours(b.pid) for b in beats.values())

    def _end_unreaped(self, beats: dict, after_s: float) -> int:
        """Every rank ended, the run incomplete, and torchrun did not end: end it, naming how each
        rank that did not finish ended (its exit status, read before the job's end reaps it) and
        where it was, unless a rank's own line said why (``status/cause.txt``)."""
        ended = [
            f"rank {r} {_how_it_ended(b.pid)} on {where(self.status, r)}{stacks_note(self.status, r)}"
            for r, b in sorted(beats.items())
            if b.state != "done"
        ]
        self._end_job()
        cause = read_status(cause_path(self.status))
        line = f"torchrun had not ended {after_s:.1f} s after every rank had; it was ended"
        lines = [cause, line] if cause else [*ended, line]
        for text in lines[1:] if cause else lines:  # (the rank printed its own line)
            print(f"ppx: error: {text}", file=sys.stderr, flush=True)
        return self._incomplete(lines, 1)

    # -- the three ways a job ends early
    def _frozen(self, beats: dict) -> list[tuple[int, int, float]]:
        """(rank, pid, silent seconds) of each rank alive whose heartbeat (``beats``: `read_beats`'s)
        is stale past the timeout."""
        now, frozen = time.monotonic(), []
        for rank, beat in beats.items():
            if self._seen.get(rank) != beat.key:
                self._seen[rank], self._moved[rank] = beat.key, now
                continue
            silent = now - self._moved[rank]
            # a live rank beats every INTERVAL_S: a timeout shorter than a few beats would see one frozen
            if beat.state == "alive" and silent > max(self.timeout_s, 3 * INTERVAL_S) and self._ours(beat.pid):
                frozen.append((rank, beat.pid, silent))
        return frozen

    def _end_frozen(self, frozen: list[tuple[int, int, float]]) -> int:
        lines = [stopped_responding(rank, silent, where(self.status, rank)) for rank, _, silent in frozen]
        for line in lines:
            print(f"ppx: error: {line}", file=sys.stderr, flush=True)
        self._end_job(first=[pid for _, pid, _ in frozen])
        return self._incomplete(lines, 1)

    def _stopped(self, signum: int) -> int:
        states = self._where_each()
        complete = self._complete(read_beats(self.status))
        self._end_job()
        return report_stop(self.run_dir, signum, time.monotonic() - self.started, states, complete)

    def _failed(self, code: int) -> int:
        # torchrun ends its workers before it fails, unless it was killed: started workers (CUDA
        # runs' ranks, sessions of their own) would run on without it and finish the run
        self._end_workers()
        failures = self._failures()
        lines = killed(failures, self.status)
        # torchrun itself ended by a signal (killed; or stopped: it returns 128 + a stop signal),
        # no rank having failed before: not "the job failed"
        sig = -code if code < 0 else code - 128 if code - 128 in STOP_SIGNALS and not failures else None
        if sig is not None and not lines and not read_status(cause_path(self.status)):
            how = "killed" if code < 0 else "stopped"
            lines = [f"torchrun, which runs the ranks, was {how} by signal {_signal_name(sig)} ({sig}); "]
            lines[0] += self._where_each()
        code = code if code > 0 else 128 - code
        if not lines:
            failed = f"the job failed (exit {code}); {self._where_each()}"
            cause = read_status(cause_path(self.status))
            if cause:  # the rank that failed first said why, in its line: the run keeps both
                return self._incomplete([cause, failed], code)
            lines.append(failed)
        for line in lines:
            print(f"ppx: error: {line}", file=sys.stderr, flush=True)
        return self._incomplete(lines, code)

    def _incomplete(self, lines: list[str], code: int) -> int:
        write_incomplete(self.run_dir, lines)
        gone = "" if self.run_dir.is_dir() else ", removed while the job ran"
        print(f"ppx: run directory (incomplete{gone}): {self.run_dir}", file=sys.stderr, flush=True)
        return code

    # -- where the ranks were
    def _where_each(self) -> str:
        if not self.status.is_dir():  # (the run directory removed under the job)
            return f"where each rank was: unknown ({self.status} is gone)"
        states = [f"rank {r}: {read_status(status_path(self.status, r)) or 'not started'}" for r in range(self.world)]
        return "where each rank was: " + "; ".join(states)

    def _failures(self) -> list[tuple[int, int, bool]]:
        """(rank, exit code, seen first: `killed`) of each rank torchrun saw fail, from its JSON
        (none if absent)."""
        try:
            failed = json.loads(self.exits.read_text())
            return sorted((int(rank), int(f["exitcode"]), bool(f.get("first"))) for rank, f in failed.items())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []

    # -- ending the job
    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is a live (not zombie) worker of this run."""
        if not process_alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        if str(self.run_dir).encode() not in cmdline:
            return False
        if b"ppx.launch.torchrun" not in cmdline:
            return b"ppx.launch.worker" in cmdline
        return FORKED in cmdline and pid != self.proc.pid  # torchrun's forked workers, not torchrun

    def _workers(self) -> set[int]:
        """This run's live workers, wherever they are in the process tree (orphans included)."""
        return {pid for pid in _pids() if self._ours(pid)}

    def _end_job(self, first: list[int] = ()) -> None:
        """End torchrun and every worker: torchrun stopped first (it starts no worker more and
        restarts none), SIGKILL to ``first`` (frozen: a stopped process ignores SIGTERM),
        SIGTERM to the other workers and SIGKILL to those left after GRACE_S, then SIGKILL to
        torchrun's process group (torchrun, which has nothing left to do, and what forked ranks
        started; the launcher explains the job's end). Every worker is stopped (SIGSTOP) before
        any is ended, so none runs on to find a peer gone and print that as its own failure;
        each then has SIGTERM pending when SIGCONT wakes it, and dies of it before it runs
        again."""
        self.proc.send_signal(signal.SIGSTOP)  # (Popen signals only a child it has not reaped)
        self._end_workers(first)
        _kill_group(self.proc.pid, signal.SIGKILL)  # torchrun leads its group; not reaped yet
        self.proc.wait()
        _wait(lambda: not self._workers(), GRACE_S)  # orphans of torchrun now: init reaps them

    def _end_workers(self, first: list[int] = ()) -> None:
        """`_end_job`'s part for the workers: each stopped, then ``first`` SIGKILLed, the others
        SIGTERMed and woken, and SIGKILL to any left after GRACE_S."""
        workers = self._workers()
        for pid in workers:
            _kill_group(pid, signal.SIGSTOP)
        for pid in first:
            if self._ours(pid):
                _kill_group(pid, signal.SIGKILL)
        rest = workers - set(first)
        for pid in rest:
            _kill_group(pid, signal.SIGTERM)
        for pid in rest:
            _kill_group(pid, signal.SIGCONT)
        _wait(lambda: not any(self._ours(p) for p in workers), GRACE_S)
        for pid in self._workers():
            _kill_group(pid, signal.SIGKILL)


def _wait(done, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def killed(failures: list[tuple[int, int, bool]], status: Path) -> list[str]:
    """A line for each rank a signal killed, of the (rank, exit code, seen first) torchrun saw
    fail, naming the action its status file (in ``status``) says it was on. torchrun SIGTERMs
    the other workers once it has seen one fail: a SIGTERM is a cause (a ``kill <pid>``) only
    where torchrun saw it first (``seen first``) or a failing peer found that rank's process
    already gone (`note_gone`), or where every failure was one."""
    gone = read_gone(status)
    causes = [(rank, code) for rank, code, first in failures if first or rank in gone or code != -signal.SIGTERM]
    causes = causes or [(rank, code) for rank, code, _ in failures]
    return [
        f"rank {rank} died: killed by signal {_signal_name(-code)} ({-code}) on {where(status, rank)}"
        + stacks_note(status, rank)
        for rank, code in causes
        if code < 0
    ]


def report_stop(run_dir: Path, signum: int, after_s: float, states: str, complete: bool) -> int:
    """A job ended by ``signum`` ``after_s`` seconds in: its one line and, unless the run had
    ``complete``d (then nothing of it was lost: never marked incomplete), ``incomplete.txt``
    with ``states`` (where each rank was); the exit code, 128 + the signal."""
    name = signal.Signals(signum).name
    if complete:
        print(f"ppx: stopped by {name} after the run completed: {run_dir}", file=sys.stderr, flush=True)
        return 128 + signum
    write_incomplete(run_dir, [f"stopped: ppx run received {name} after {after_s:.1f} s and ended the job; {states}"])
    print(
        f"ppx: stopped by {name}: the job was ended; run directory (incomplete): {run_dir}", file=sys.stderr, flush=True
    )
    return 128 + signum


def write_incomplete(run_dir: Path, lines: list[str], append: bool = False) -> None:
    """``<run>/incomplete.txt``: why the run did not complete, a line each (``append``: under
    srun each node's launcher adds what it saw, but not a line the file holds already: two
    nodes' launchers that both saw only the job's cause write it once). A run directory that
    cannot take it is left as it is."""
    try:
        with open(run_dir / "incomplete.txt", "a+" if append else "w", errors="replace") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # (another node's launcher may be appending now)
            f.seek(0)
            held = set(f.read().splitlines()) if append else set()
            f.write("".join(line + "\n" for line in lines if line not in held))
    except OSError:
        pass


def where(status: Path, rank: int) -> str:
    """Where rank ``rank`` was, by its status file in ``status``."""
    return read_status(status_path(status, rank)) or "start-up (before its first status)"


def _how_it_ended(pid: int) -> str:
    """How process ``pid`` ended, from its exit status while it is a zombie (/proc's stat
    field 52, Linux 3.5 on): "died: killed by signal SIGKILL (9)", "exited with code 1", or,
    where it is gone, "ended"."""
    status = zombie_status(pid)
    if status is None:
        return "ended"
    if status & 0x7F:
        return f"died: killed by signal {_signal_name(status & 0x7F)} ({status & 0x7F})"
    return f"exited with code {status >> 8}"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc (not Linux): the job is torchrun's to end
        return []


def _kill_group(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads (torchrun and each started worker lead one),
    or to the process alone if it leads none (a forked worker, in torchrun's group)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    except PermissionError:
        pass
