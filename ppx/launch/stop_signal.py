"""A rank that torchrun stops (SIGTERM) because a peer of this machine died names that peer
before it ends, where no ``ppx run`` is there to (a user's own torchrun, srun).

torchrun SIGTERMs the survivors as soon as it sees one rank's exit, and a survivor busy in
its own compute, or slow to be scheduled on a loaded machine, has not yet seen its wait on
the dead peer fail (`ppx.launch.failure_line`): it ended without a line, and the job's
output named nobody. A SIGTERM's Python handler runs only when the main thread gets back to
Python (never while it waits inside gloo), so the signal is followed from a thread of its
own through Python's wakeup file descriptor. The thread lets a failure line the main thread
is writing finish, marks this rank's heartbeat "stopped", names a peer that died (not one
that says "stopped": ranks stopped together, as by scancel, name nobody), and ends the
process by SIGTERM as it would have ended without it. The signal's Python handler marks the
rank stopped too, as soon as the main thread is back in Python (a failed wait), so that its
failure line blames no peer stopped with it should the thread not have run yet; after that
line the main thread waits for the thread to end it (`await_stop`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from ppx.launch.failure_line import REPORTING, STOPPED, name_dead_peer
from ppx.launch.heartbeat import CHECK_WINDOW_S
from ppx.launch.watchdog import Watchdog, launcher_alive

# the most a SIGTERM waits for a failure line the main thread is making (`report_failure`:
# up to 1 s for a peer's process to show gone, then a window on the beats of peers elsewhere)
REPORT_WAIT_S = 1.0 + CHECK_WINDOW_S + 1.5
_pipe: list[int] = []  # the wakeup pipe's two ends, once followed (a forked child closes them)


def follow_stop_signal(watchdog: Watchdog) -> bool:
    """Follow SIGTERM in a thread (above) where no launcher names a killed rank of this machine
    (``ppx run``; under srun, ppx's torchrun wrapper: PPX_RUN_DIR), SIGTERM and the wakeup file
    descriptor are free (a one-rank ``ppx run`` handles them) and this is the main thread;
    False where it is not followed."""
    if launcher_alive() or os.environ.get("PPX_RUN_DIR") or watchdog.status_dir is None:
        return False
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)
    before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if before != -1:  # someone else's: theirs again
        signal.set_wakeup_fd(before)
        os.close(read), os.close(write)
        return False
    # the thread does the work; the handler, run by the main thread as soon as it is back in
    # Python (a failed wait), marks the rank stopped before its failure line is made, should the
    # thread not have run yet on a loaded machine (it would blame a peer stopped with it)
    signal.signal(signal.SIGTERM, lambda signum, frame: STOPPED.set())
    if not _pipe:
        os.register_at_fork(after_in_child=_forget)
    _pipe[:] = [read, write]
    threading.Thread(target=_follow, args=(read, watchdog), name="ppx-stop-signal", daemon=True).start()
    return True


def await_stop() -> None:
    """In the main thread, after its failure line: where a followed SIGTERM stops this rank, wait
    for the thread to end it by that SIGTERM, as it would have ended without ppx, rather than
    exit with the rank's own code first."""
    if STOPPED.is_set() and _pipe:
        time.sleep(REPORT_WAIT_S + 5.0)  # (the thread ends the process within REPORT_WAIT_S and its naming)


def _forget() -> None:
    """In a process a rank forks (a DataLoader's worker): SIGTERM and the wakeup fd as a new
    process has them, so that a SIGTERM ends it, and not its rank."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # (forked from another thread than the main one)
        _default_sigterm()
    for fd in _pipe:
        try:
            os.close(fd)
        except OSError:
            pass
    _pipe.clear()


def _follow(fd: int, watchdog: Watchdog) -> None:
    try:
        while signal.SIGTERM not in (got := os.read(fd, 64)):  # each byte a signal Python handles
            if not got:  # (the pipe closed under us: SIGTERM ends the process as it would have)
                _default_sigterm()
                return
    except OSError:
        _default_sigterm()
        return
    STOPPED.set()  # this rank's own failure line, if one comes, blames no peer stopped with it
    try:
        if REPORTING.acquire(timeout=REPORT_WAIT_S):  # the main thread's own line first
            try:
                name_dead_peer(watchdog)
            finally:
                REPORTING.release()
    finally:
        _end_by_sigterm()


def _default_sigterm() -> None:
    """SIGTERM's default action again, from any thread (Python sets handlers from the main
    thread only; libc's signal() from any)."""
    libc_signal = ctypes.CDLL(None).signal
    libc_signal.argtypes, libc_signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
    libc_signal(signal.SIGTERM, None)  # SIG_DFL


def _end_by_sigterm() -> None:
    """End the process as the SIGTERM would have without a handler."""
    _default_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # (delivered at once; should it not be)
    os._exit(128 + signal.SIGTERM)
