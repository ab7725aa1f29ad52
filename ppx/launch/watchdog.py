"""Per-rank watchdog: ends the job when one rank makes no progress for ``timeout_s``.

It follows what the rank is doing (every program item, plus phases such as the optimizer
step) and mirrors it into ``<run>/status/rank<r>.txt`` through a shared memory map, so the
file names the exact action even when the process is killed (the launcher reads it to
explain a failed job). Past the timeout it prints one line naming the rank and the action
and exits the process, which makes torchrun end the other ranks. The job's first failure
keeps its line in ``<run>/status/cause.txt`` (`claim_cause`): a rank that fails after it,
its peer gone from under a wait, is a consequence and says nothing more.

It also keeps the rank's heartbeat (`ppx.launch.heartbeat`). A rank stalled in a wait first
reads its peers' heartbeats: a peer whose heartbeat has stopped is frozen, and the wait is
its fault, not this rank's. Under ``ppx run`` the launcher watches the heartbeats and names
the frozen rank itself, so the watchdog leaves that to it (once: if the job is still there
a full timeout later, it acts alone); under a torchrun or srun of the user's, it names the
frozen rank and ends its own process.

On a GPU the host queues a step ahead of the device and then waits at the step's end, so
the watchdog also follows ``device_position`` (the first action the GPU has not finished,
from the CUDA timer's events) when it is set: the GPU moving on counts as progress, and a
hang names the action the GPU is stuck on.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ppx.launch.heartbeat import Heartbeat, read_beats, stale_peers, stopped_responding

EXIT_TIMEOUT = 3
STATUS_BYTES = 512
SETUP_FLOOR_S = 60.0  # a set-up phase (the build, the first collectives) is allowed at least this long


def _status_line(text: bytes) -> bytes:
    """A status file's fixed-size content: one text line, padded with spaces (grep and cat
    read it as text; the mapping never changes size)."""
    return text[: STATUS_BYTES - 1].ljust(STATUS_BYTES - 1, b" ") + b"\n"


def status_path(status_dir: Path, rank: int) -> Path:
    """Where rank ``rank``'s watchdog keeps its status line (beside its heartbeat)."""
    return Path(status_dir) / f"rank{rank}.txt"


def read_status(path: Path) -> str:
    """The text a watchdog left in a status file ('' if none)."""
    try:
        return path.read_bytes().rstrip(b"\0 \n").decode(errors="replace")
    except OSError:
        return ""


def cause_path(status_dir: Path) -> Path:
    """Where the job's first failure is kept: the line of the rank that failed first."""
    return Path(status_dir) / "cause.txt"


def claim_cause(status_dir: Path | None, line: str) -> bool:
    """Keep ``line`` as why the job failed, unless a rank already did (the file is created
    once, O_EXCL, on a filesystem the ranks share): True for the job's first failure, whose
    line is the cause, False for one after it (a peer gone from under a wait: a consequence).
    True too where there is no status folder to tell by."""
    if status_dir is None:
        return True
    try:
        fd = os.open(cause_path(status_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except OSError:
        return True
    try:
        os.write(fd, f"{line}\n".encode())
    except OSError:  # (a full disk: the file claims the cause, the line is still said)
        pass
    finally:
        os.close(fd)
    return True


class Watchdog:
    def __init__(
        self,
        rank: int,
        timeout_s: float,
        status_dir: Path | None = None,
        poll_s: float = 0.1,
        heartbeat: Heartbeat | None = None,
    ):
        self.rank, self.timeout_s, self.poll_s = rank, timeout_s, poll_s
        self.grace_s = max(1.0, 0.25 * timeout_s)
        self.limit_s = timeout_s
        self.step = -1
        self.label = "starting"
        self.finished = False  # the label's compute action has ended (what follows waits)
        self.since = time.monotonic()
        self._map = None
        self.status_dir = Path(status_dir) if status_dir is not None else None
        # (``heartbeat``: one the rank started before it had a watchdog, kept on)
        self.heartbeat = heartbeat or (Heartbeat(self.status_dir, rank) if status_dir is not None else None)
        self._deferred = False
        if self.status_dir is not None:
            self.status_dir.mkdir(parents=True, exist_ok=True)
            with open(status_path(self.status_dir, rank), "w+b") as f:
                f.write(_status_line(b"starting"))
                f.flush()
                self._map = mmap.mmap(f.fileno(), STATUS_BYTES)
        self.device_position: Callable[[], str | None] | None = None
        self._device_at: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ppx-watchdog", daemon=True)

    # observer interface: called around every program item
    def before(self, item) -> None:
        self.limit_s = self.timeout_s if item.kind == "compute" else self.timeout_s + self.grace_s
        self._set(item.label)

    def after(self, item) -> None:
        if item.kind == "compute":  # waiting from here (torch's executor receives outside ppx's items)
            self.limit_s = self.timeout_s + self.grace_s
            self.finished = True

    def phase(self, label: str, step: int | None = None, setup: bool = False) -> None:
        """Record a phase outside the action list (barrier, optimizer step, ...). A ``setup``
        phase (building the model: CUDA's first calls, a model's initialisation; the first
        collectives, which wait for every rank's build; NCCL's first collective) is allowed at
        least ``SETUP_FLOOR_S``, whatever a short timeout says: its length is the machine's, not
        a hang's."""
        if step is not None:
            self.step = step
        timeout = max(self.timeout_s, SETUP_FLOOR_S) if setup else self.timeout_s
        self.limit_s = timeout + self.grace_s  # phases wait on other ranks
        self._set(label)

    def where(self) -> str:
        label = f"after {self.label}" if self.finished else self.label
        where = f"{label} (step {self.step})" if self.step >= 0 else label
        return f"{where}; the GPU is on {self._device_at}" if self._device_at else where

    def _set(self, label: str) -> None:
        self.label, self.finished = label, False
        self.since = time.monotonic()
        self._mirror()

    def _mirror(self) -> None:
        if self._map is not None:
            self._map[:] = _status_line(self.where().encode())

    def start(self) -> Watchdog:
        if self.heartbeat is not None:
            self.heartbeat.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.device_position is not None:
                at = self.device_position()
                if at != self._device_at:  # the device moved on: progress, even while the host waits
                    self._device_at = at
                    self.since = time.monotonic()
                    self._mirror()
            stalled = time.monotonic() - self.since
            if self.finished and stalled > self.poll_s:  # waiting after an action: the status file says so
                self._mirror()  # (here, not in `after`: no cost on the rank's own thread)
                if not self.finished:  # an action began meanwhile: its label, not the old one
                    self._mirror()
            if stalled > self.limit_s:
                if self.limit_s > self.timeout_s and self._blame_a_frozen_peer():
                    continue  # a frozen peer is the cause: the launcher ends the job
                stalled = time.monotonic() - self.since
                if stalled <= self.limit_s:
                    continue  # progress while the peers were read
                line = (
                    f"rank {self.rank} made no progress for {stalled:.1f} s on {self.where()}; "
                    f"ending the job (runtime.timeout_s={self.timeout_s:g})"
                )
                if claim_cause(self.status_dir, line):  # else a rank failed first: its line says it
                    sys.stderr.write(f"ppx: error: {line}\n")
                self._exit()

    def _blame_a_frozen_peer(self) -> bool:
        """Stalled in a wait: if a peer's heartbeat has stopped, that peer is the cause. With a
        ppx launcher alive, leave the naming and the ending to it (True); without one, name the
        peer and end this process. False if every peer's heartbeat moves."""
        if self.status_dir is None or not set(read_beats(self.status_dir)) - {self.rank}:
            return False  # no peer keeps a heartbeat here
        frozen = stale_peers(self.status_dir, self.rank)
        if not frozen:
            return False
        if not self._deferred and launcher_alive():
            self._deferred = True
            self.since = time.monotonic()
            return True
        for beat in frozen:
            where = read_status(status_path(self.status_dir, beat.rank))
            line = stopped_responding(beat.rank, max(0.0, time.time() - beat.wall), where)
            line += f" (seen by rank {self.rank}, which ends its process; runtime.timeout_s={self.timeout_s:g})"
            if claim_cause(self.status_dir, line):  # one line, whoever saw the frozen peer first
                sys.stderr.write(f"ppx: error: {line}\n")
        self._exit()

    def _exit(self) -> None:
        sys.stderr.flush()
        if self.heartbeat is not None:
            self.heartbeat.stop()  # ended on its own: its silence from now on is no freeze
        os._exit(EXIT_TIMEOUT)


def launcher_alive() -> bool:
    """Whether the ``ppx run`` that started this job (PPX_LAUNCHER_PID) is still there."""
    try:
        pid = int(os.environ.get("PPX_LAUNCHER_PID", ""))
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
