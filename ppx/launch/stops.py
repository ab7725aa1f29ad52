"""Stop signals (SIGTERM, SIGINT, SIGHUP: a ``kill``, a ``timeout``, Ctrl-C, a closed
terminal; SIGUSR1, SIGUSR2: a job manager's warning, whose default action ended ``ppx run``
without a word) in ``ppx run`` and ``ppx sweep``: a handler of one's own for a stretch of
code, or the signals held there to be acted on once there is a job to end."""

from __future__ import annotations

import contextlib
import os
import signal

WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)  # a job manager's warning (SLURM's --signal)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, *WARNINGS)


@contextlib.contextmanager
def stops_handled(handler):
    """``handler(signum, frame)`` for every stop signal inside; the handlers before it after."""
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


@contextlib.contextmanager
def stops_held():
    """Stop signals received inside, held (a list, in order) instead of ending the process:
    between claiming a run directory and watching its job, a SIGTERM left the folder without
    incomplete.txt (`supervise` and `run_in_process` `take` one from the list and end as
    stopped). One held and not taken (an error first, or after the job) is sent again on leaving."""
    got: list[int] = []
    try:
        with stops_handled(lambda signum, frame: got.append(signum)):
            yield got
    finally:
        if got:
            os.kill(os.getpid(), got[0])


def take(held: list[int]) -> int:
    """The first stop `stops_held` held, the list emptied: taken, it is not sent again."""
    signum, held[:] = held[0], []
    return signum
