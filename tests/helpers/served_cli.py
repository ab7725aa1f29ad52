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
import pkgutil
import selectors
import signal
import subprocess
import time
from pathlib import Path

from ppx.launch import agent_server
from ppx.launch.served_agent import CLI_MODULE, STOPPED, ServedAgent

SERVER_ENV = "PPX_TEST_COMMAND_SERVER"  # the command server's socket (tests/conftest.py)
# what ppx's commands import, besides transformers (the server's own): torch._dynamo (which fake
# tensors and the FLOP counter import at their first use), matplotlib, and each command's module
PRELOAD = ("torch._dynamo", "torch._subclasses.fake_tensor", "torch.utils.flop_counter", "matplotlib.pyplot")


def start_server(path: Path) -> subprocess.Popen:
    """The command server at ``path``, with this process's environment (it ends with this process)."""
    import ppx.commands

    commands = [m.name for m in pkgutil.iter_modules(ppx.commands.__path__, "ppx.commands.")]
    return agent_server.start_server(path, CLI_MODULE, [agent_server.TRANSFORMERS, *PRELOAD, *commands])


def served_run(command: list[str], env: dict, cwd, timeout: float) -> subprocess.CompletedProcess | None:
    """``subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout)`` forked from the command server; None where there is none or it refuses."""
    server = os.environ.get(SERVER_ENV)
    if not server:
        return None
    deadline = time.monotonic() + timeout  # (the server's answer counted: it may be importing still)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    proc = None
    try:
        try:
            env = {str(k): os.fspath(v) for k, v in env.items()}
            proc = ServedAgent.request(
                server, command, env, stopped=lambda: time.monotonic() > deadline, fds=[0, out_w, err_w], cwd=cwd
            )
        finally:
            os.close(out_w)
            os.close(err_w)
        if proc == STOPPED:
            raise subprocess.TimeoutExpired(command, timeout)
        if proc is None:
            return None
        out, err = _read(proc, {out_r: bytearray(), err_r: bytearray()}, deadline, command, timeout)
    finally:
        os.close(out_r)
        os.close(err_r)
        if isinstance(proc, ServedAgent):
            proc.conn.close()  # (the server reaps it)
    if proc.lost:
        raise RuntimeError(f"the command server went away while it ran {' '.join(command)}")
    return subprocess.CompletedProcess(command, proc.returncode, _text(out), _text(err))


def _read(proc: ServedAgent, got: dict, deadline: float, command: list[str], timeout: float) -> tuple[bytes, bytes]:
    """Both streams to their ends, then the exit status, by ``deadline`` (as subprocess.run:
    SIGKILL and TimeoutExpired after it)."""
    out_r, err_r = got
    with selectors.DefaultSelector() as sel:
        for fd in got:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            ready = sel.select(max(left, 0)) if left > 0 else []
            if not ready:
                _kill(proc)
                raise subprocess.TimeoutExpired(command, timeout, bytes(got[out_r]), bytes(got[err_r]))
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
            raise subprocess.TimeoutExpired(command, timeout, bytes(got[out_r]), bytes(got[err_r])) from None
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
