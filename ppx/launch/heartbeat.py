"""Heartbeats: every rank rewrites ``<run>/status/rank<r>.beat`` about once a second from a
thread of its own, so a rank whose process is frozen (SIGSTOP, a stuck node) is told apart
from one that is merely waiting on a peer: a waiting rank's thread still beats, a stopped
process's threads all stop.

The file is one fixed-size text line, ``<pid> <host> <count> <unix time> <state> <pid
namespace>``, rewritten
in place and closed after each beat (on a shared filesystem, close is what publishes it to
other nodes). Readers open it anew each time and compare counts, so they need no clock in
common with the writer: a beat that has not moved across a window is stale, whatever the
clocks say. The launcher (`ppx.launch.supervisor`) watches them; the in-rank watchdog reads
them when it fires, to name a frozen peer instead of blaming itself for waiting on it; a rank
that fails looks up its peers' pids (`gone_peers`), where it can see them (the same host and
pid namespace), to tell a peer killed from under it, and watches the others' beats
(`silent_peers_elsewhere`) where it cannot.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ppx.launch.processes import process_alive

BEAT_BYTES = 128
INTERVAL_S = 1.0
CHECK_WINDOW_S = 2.5  # longer than two beats: a live rank's count moves within it
# a silent peer whose last beat is younger than this when a wait on it failed died then; a
# frozen one's is as old as the failed wait's timeout (30 s or more); clocks a few seconds apart
DIED_WITHIN_S = 10.0


@dataclass(frozen=True)
class Beat:
    rank: int
    pid: int
    host: str
    count: int
    wall: float  # the writer's time.time() at the beat (for messages only)
    state: str  # "alive"; "done" once the rank has ended on its own; "stopped" by a SIGTERM
    pidns: str = "-"  # the writer's pid namespace ("-": unknown): where its pid means that process

    @property
    def key(self) -> tuple:
        return (self.pid, self.count, self.state)


def beat_path(status_dir: Path, rank: int) -> Path:
    return Path(status_dir) / f"rank{rank}.beat"


class Heartbeat:
    """One rank's heartbeat thread (a daemon: it ends with the process, as it should)."""

    def __init__(self, status_dir: Path, rank: int, interval_s: float = INTERVAL_S):
        self.path = beat_path(status_dir, rank)
        self.interval_s = interval_s
        self.count = 0
        self._prefix = f"{os.getpid()} {this_host()}"
        self._suffix = pid_namespace()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ppx-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        """Beat from now on (again: nothing more, where it beats already)."""
        if not self._thread.is_alive() and not self._stop.is_set():
            self._write("alive")
            self._thread.start()
        return self

    def stop(self, state: str = "done") -> None:
        """The rank ends on its own (or, ``state="stopped"``, by a SIGTERM that no peer's death
        explains): say so, so that its silence is not taken for a freeze, nor its end for a death."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval_s)  # its last "alive" must not land after "done"
        self._write(state)

    @property
    def ended(self) -> bool:
        """Whether `stop` has been called: the rank's last state is written."""
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write("alive")

    def _write(self, state: str) -> None:
        self.count += 1
        line = f"{self._prefix} {self.count} {time.time():.1f} {state} {self._suffix}".encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, line[: BEAT_BYTES - 1].ljust(BEAT_BYTES - 1) + b"\n", 0)
            finally:
                os.close(fd)
        except OSError:  # a full or vanished disk must not end the rank; the silence will show
            pass


def read_beat(path: Path, rank: int) -> Beat | None:
    try:
        fields = Path(path).read_text(errors="replace").split()
        ns = fields[5] if len(fields) > 5 else "-"
        return Beat(rank, int(fields[0]), fields[1], int(fields[2]), float(fields[3]), fields[4], ns)
    except (OSError, ValueError, IndexError):  # absent, or caught mid-write: no news
        return None


def read_beats(status_dir: Path) -> dict[int, Beat]:
    """Every rank's last beat found in ``status_dir``, by rank."""
    beats = {}
    try:
        names = os.listdir(status_dir)
    except OSError:
        return beats
    for name in names:
        if name.startswith("rank") and name.endswith(".beat") and name[4:-5].isdigit():
            beat = read_beat(Path(status_dir) / name, int(name[4:-5]))
            if beat is not None:
                beats[beat.rank] = beat
    return beats


def stale_peers(status_dir: Path, me: int, window_s: float = CHECK_WINDOW_S) -> list[Beat]:
    """The other ranks whose heartbeat did not move in ``window_s`` while saying 'alive':
    frozen, or gone without a word (killed). Reads the beats twice, ``window_s`` apart."""
    first = read_beats(status_dir)
    time.sleep(window_s)
    second = read_beats(status_dir)
    return [
        b for r, b in sorted(second.items()) if r != me and b.state == "alive" and r in first and first[r].key == b.key
    ]


def this_host() -> str:
    """The host name a beat carries (its first label)."""
    return socket.gethostname().split(".")[0] or "-"


def pid_namespace() -> str:
    """This process's pid namespace (its /proc/self/ns/pid inode), "-" where there is none to read."""
    try:
        return os.readlink("/proc/self/ns/pid").rsplit("[", 1)[-1].rstrip("]")
    except OSError:
        return "-"


def gone_peers(status_dir: Path, me: int, wait_s: float = 1.0, stopped: bool = True) -> list[Beat]:
    """The other ranks whose process ended without saying 'done' (killed; and, if ``stopped``,
    ended by a SIGTERM that no peer's death explained), among those whose pid this process can
    look up (the same host and pid namespace: a peer elsewhere is never listed), looked for
    until one is found or ``wait_s`` passed: a killed process closes its sockets (its peers'
    waits fail) a moment before /proc shows it a zombie."""
    states = ("alive", "stopped") if stopped else ("alive",)
    host, ns, end = this_host(), pid_namespace(), time.monotonic() + wait_s
    if ns == "-":
        return []
    while True:
        mine = [b for r, b in sorted(read_beats(status_dir).items()) if r != me and b.host == host and b.pidns == ns]
        gone = [b for b in mine if b.state in states and not process_alive(b.pid)]
        if gone or not mine or time.monotonic() >= end:
            return gone
        time.sleep(0.01)


def note_gone(status_dir: Path, ranks: list[int]) -> None:
    """Keep that a failing rank found ``ranks``' processes ended (``gone.txt``, a rank a line):
    a rank ended by a plain ``kill`` (SIGTERM) is then told from those torchrun SIGTERMs after
    the first failure (`ppx.launch.supervisor.killed`). A folder that cannot take it keeps none."""
    try:
        with open(Path(status_dir) / "gone.txt", "a") as f:
            f.write("".join(f"{r}\n" for r in ranks))
    except OSError:
        pass


def read_gone(status_dir: Path) -> set[int]:
    """The ranks `note_gone` kept."""
    try:
        return {int(x) for x in (Path(status_dir) / "gone.txt").read_text().split()}
    except (OSError, ValueError):
        return set()


def silent_peers_elsewhere(status_dir: Path, me: int, window_s: float = CHECK_WINDOW_S) -> list[Beat]:
    """The other ranks this process cannot look up (another host or pid namespace) whose
    heartbeat says 'alive' and did not move in ``window_s``: ended (killed) or frozen, which
    the age of their last beat tells apart (`DIED_WITHIN_S`). Returns at once when no such
    peer keeps a heartbeat."""
    host, ns = this_host(), pid_namespace()

    def elsewhere(b: Beat) -> bool:
        return b.rank != me and b.state == "alive" and (b.host != host or b.pidns != ns or ns == "-")

    if not any(elsewhere(b) for b in read_beats(status_dir).values()):
        return []
    return [b for b in stale_peers(status_dir, me, window_s) if elsewhere(b)]


def stopped_responding(rank: int, silent_s: float, where: str) -> str:
    """The one line that names a frozen rank (the launcher's and the watchdog's alike)."""
    on = f"; it was on {where}" if where else ""
    return f"rank {rank} stopped responding (no heartbeat for {silent_s:.1f} s){on}"
