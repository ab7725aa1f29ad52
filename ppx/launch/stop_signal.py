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
process by SIGTERM as it would have ended without it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from ppx.launch.failure_line import REPORTING, name_dead_peer
from ppx.launch.watchdog import Watchdog, launcher_alive

REPORT_WAIT_S = 3.0  # the most a SIGTERM waits for the main thread's failure line


def follow_stop_signal(watchdog: Watchdog) -> bool:
    """Follow SIGTERM in a thread (above) when no ``ppx run`` names dead ranks, SIGTERM and the
    wakeup file descriptor are free (no one-rank ``ppx run`` handles them) and this is the main
    thread; False where it is not followed."""
    if launcher_alive() or watchdog.status_dir is None or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)
    if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # someone else's: leave it
        signal.set_wakeup_fd(-1)
        os.close(read), os.close(write)
        return False
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the thread does the work
    threading.Thread(target=_follow, args=(read, watchdog), name="ppx-stop-signal", daemon=True).start()
    return True


def _follow(fd: int, watchdog: Watchdog) -> None:
    while signal.SIGTERM not in os.read(fd, 64):  # each byte a signal Python handles
        pass
    if REPORTING.acquire(timeout=REPORT_WAIT_S):  # the main thread's own line first
        try:
            name_dead_peer(watchdog)
        finally:
            REPORTING.release()
    _end_by_sigterm()


def _end_by_sigterm() -> None:
    """End the process as the SIGTERM would have without a handler (Python sets handlers from
    the main thread only; libc's signal() from any)."""
    libc_signal = ctypes.CDLL(None).signal
    libc_signal.argtypes, libc_signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
    libc_signal(signal.SIGTERM, None)  # SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # (delivered at once; should it not be)
    os._exit(128 + signal.SIGTERM)
