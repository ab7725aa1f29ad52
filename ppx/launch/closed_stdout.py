"""A rank's standard output whose reader went away (``ppx run ... | head``): the run goes on.

Rank 0 prints its progress lines to the terminal or a pipe; when a pipe's reader ends, the
next write fails with BrokenPipeError, which ended the whole job as rank 0's failure and left
the run incomplete. A rank's output is incidental to the run (every figure is in the run
directory), so after the reader has gone its writes go to /dev/null and training goes on;
`ppx run` itself writes only to stderr."""

from __future__ import annotations

import os
import sys


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


def stdout_to_null(stream=None) -> None:
    """Point ``stream``'s file descriptor (sys.stdout's by default) at /dev/null: its reader went
    away, and what its buffer still holds goes there too, at exit as well."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, (stream or sys.stdout).fileno())
    os.close(null)


def survive_closed_stdout() -> None:
    """From now on, this process's ``print`` survives its stdout's reader going away."""
    if not isinstance(sys.stdout, _Survives) and sys.stdout is not None:
        sys.stdout = _Survives(sys.stdout)
