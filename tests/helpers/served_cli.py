"""``python -m ppx.cli ...`` forked from the session's command server (`ppx.launch.agent_server`
serving `CLI_MODULE`, started by tests/conftest.py), which imported torch, torch._dynamo,
matplotlib and ppx's commands once, not a new Python importing them again (about 5 s of CPU a
``ppx plan``): the process a new one would be (its command line, environment, working folder,
``sys.path``, streams, limits), run to its end as Python runs ``-m``. A command the server
will not serve (a PYTHONPATH that holds a stand-in for a package it imported, a variable torch
reads as it is imported set otherwise) is started as a new process; the server notes it, and
``make test``'s summary counts it."""

from __future__ import annotations

import io
import os
import selectors
import signal
import subprocess
import time

from ppx.launch.served_agent import ServedAgent

SERVER_ENV = "PPX_TEST_COMMAND_SERVER"  # the command server's socket (tests/conftest.py)


def served_run(command: list[str], env: dict, cwd, timeout: float) -> subprocess.CompletedProcess | None:
    """``subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout)`` forked from the command server; None where there is none or it refuses."""
    server = os.environ.get(SERVER_ENV)
    if not server:
        return None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = ServedAgent.request(server, command, env, fds=[0, out_w, err_w], cwd=cwd)
    finally:
        os.close(out_w)
        os.close(err_w)
    if proc is None:
        os.close(out_r)
        os.close(err_r)
        return None
    try:
        out, err = _read(proc, {out_r: bytearray(), err_r: bytearray()}, time.monotonic() + timeout)
    except subprocess.TimeoutExpired as e:
        e.cmd = command
        raise
    finally:
        proc.conn.close()  # (the server reaps it)
    return subprocess.CompletedProcess(command, proc.returncode, _text(out), _text(err))


def _read(proc: ServedAgent, got: dict, deadline: float) -> tuple[bytes, bytes]:
    """Both streams to their ends, then the exit status, by ``deadline`` (as subprocess.run:
    SIGKILL and TimeoutExpired after it)."""
    out_r, err_r = got
    with selectors.DefaultSelector() as sel:
        for fd in got:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                ready = sel.select(max(left, 0)) if left > 0 else []
                if not ready:
                    _kill(proc)
                    raise subprocess.TimeoutExpired("", 0, bytes(got[out_r]), bytes(got[err_r]))
                for key, _ in ready:
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        got[key.fd] += data
                    else:
                        sel.unregister(key.fd)
            try:
                proc.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                _kill(proc)
                raise subprocess.TimeoutExpired("", 0, bytes(got[out_r]), bytes(got[err_r])) from None
        finally:
            for fd in got:
                os.close(fd)
    return bytes(got[out_r]), bytes(got[err_r])


def _kill(proc: ServedAgent) -> None:
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _text(data: bytes) -> str:
    """As ``text=True`` reads a stream: the locale's encoding, universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data)).read()
