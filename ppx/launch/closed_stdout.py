"""A run's output whose reader went away (``ppx run ... | head``, ``2>&1 | head -n 0``): the
run goes on.

Rank 0 prints its progress lines to the terminal or a pipe; when a pipe's reader ends, the
next write fails with BrokenPipeError, which ended the whole job as rank 0's failure and left
the run incomplete; `ppx run`'s own first line to a closed stderr (the CPU fallback's notice)
ended it with 141 before the job started. A run's output is incidental to it (every figure is
in the run directory), so after the reader has gone the writes of `ppx run`, `ppx sweep` and
every rank go to /dev/null and training goes on. A standard stream closed before ppx starts
(``ppx run >&-``) is /dev/null too (`open_closed_std_streams`)."""

from __future__ import annotations

import os
import sys

from ppx.files import stdout_to_null


class _Survives:
    """``stream`` whose write and flush, once its reader has gone, write to /dev/null instead."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_null()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_null()

    def _to_null(self) -> None:
        stdout_to_null(self._stream)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def survive_closed_output() -> None:
    """From now on, this process's ``print`` (to stdout or stderr) survives its reader going away."""
    if not isinstance(sys.stdout, _Survives) and sys.stdout is not None:
        sys.stdout = _Survives(sys.stdout)
    if not isinstance(sys.stderr, _Survives) and sys.stderr is not None:
        sys.stderr = _Survives(sys.stderr)


def open_closed_std_streams() -> None:
    """Standard input, output and error closed when this process started (``ppx run >&-``,
    ``2>&-``) opened on /dev/null: Python made sys.stdout (sys.stderr) None, whose every print
    and flush failed, so each rank failed after its run was written; and the job's processes
    inherit the descriptors, where a closed one is taken by the next file opened."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # (the lowest free descriptor: this one, where those below are open)
        if null != fd:
            os.dup2(null, fd)  # (inheritable, as dup2 makes it)
            os.close(null)
        os.set_inheritable(fd, True)  # (os.open's are not: the job's processes would find it closed)
        if getattr(sys, name) is None:  # (Python's own error handlers: a path's undecodable bytes print)
            errors = "backslashreplace" if fd == 2 else "surrogateescape"
            setattr(sys, name, open(fd, mode, buffering=1 if fd else -1, closefd=False, errors=errors))
