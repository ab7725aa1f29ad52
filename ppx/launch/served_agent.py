"""``ppx run``'s side of the agent server (`ppx.launch.agent_server`, the test suite's): where
``PPX_AGENT_SERVER`` names a server's socket, a CPU job's torchrun (``--start-method=fork``) is
asked of it (`start_agent`), forked from a process that imported torch once; anything else, or
a server that cannot serve, gets a plain process."""

from __future__ import annotations

import array
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import ppx
from ppx.launch.processes import FORK, process_alive

SERVER_ENV = "PPX_AGENT_SERVER"
AGENT_MODULE = "ppx.launch.torchrun"
CLI_MODULE = "ppx.cli"  # (what the test suite's command server runs: `ppx.launch.agent_server`)
CONNECT_S = 5.0  # connecting and sending (a server there takes a request at once)
REPLY_S = 120.0  # a server's longest wait to answer (its imports, on a slow machine)
LOOK_S = 0.1  # between looks at a stop while the answer is awaited
MESSAGE_BYTES = 1 << 20  # a request's most bytes (the environment)
LIMITS = [name for name in dir(resource) if name.startswith("RLIMIT_")]  # (ulimit's: files, file size, ...)
STOPPED = "stopped"  # (`ServedAgent.request` where a stop came first)


def start_agent(command: list[str], env: dict, server: str | None = None, stopped: Callable[[], bool] = bool):
    """The torchrun ``command`` started in a session of its own with ``env``: a
    `subprocess.Popen`, or where ``server`` (default: ``PPX_AGENT_SERVER`` of ``env``) serves
    it, a `ServedAgent` forked there; None where ``stopped()`` turned true while the server was
    asked (nothing started)."""
    server = server if server is not None else env.get(SERVER_ENV)
    if server and command[:3] == [sys.executable, "-m", AGENT_MODULE] and FORK in command:
        agent = ServedAgent.request(server, command, env, stopped)
        if agent == STOPPED:
            return None
        if agent is not None:
            return agent
    return subprocess.Popen(command, env=env, start_new_session=True)


class ServedAgent:
    """An agent a server forked: Popen's ``pid``, ``returncode``, ``poll``, ``wait`` and
    ``send_signal``, its exit status read from the server's connection. The server reaps the
    agent only once this process closes the connection (at its end), so its pid stays held as
    an unreaped child's would. A server that goes away leaves the agent's end to be seen in /proc
    (exit code 1)."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None
        self._lost = False  # the server went away before it reported the exit

    @classmethod
    def request(
        cls, server: str, command: list[str], env: dict, stopped: Callable[[], bool] = bool, fds=None, cwd=None
    ):
        """The agent forked for ``command``; None where the server is not there or refuses;
        `STOPPED` where ``stopped()`` came true first (the server ends what it forked).
        ``fds``, ``cwd``: its stdin, stdout and stderr, and working folder (default: this process's)."""
        # (first: a closed stdio fd is not taken by the socket)
        fds, opened = (list(fds), []) if fds is not None else _std_fds()
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                conn.settimeout(CONNECT_S)
                conn.connect(server)
                message = json.dumps(_request(command, env, cwd)).encode()
                conn.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            except (OSError, ValueError):
                conn.close()
                return None
        finally:
            for fd in opened:
                os.close(fd)
        reply = _answer(conn, stopped)
        if reply == STOPPED or "pid" not in reply:
            conn.close()
            return reply if reply == STOPPED else None
        conn.settimeout(None)
        return cls(conn, int(reply["pid"]))

    @property
    def lost(self) -> bool:
        """Whether the server went away before it reported the agent's exit."""
        return self._lost

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (Popen's: -N for a signal N); raises TimeoutExpired after ``timeout`` s."""
        if self.returncode is None and not self._read(timeout):
            raise subprocess.TimeoutExpired(AGENT_MODULE, timeout)
        return self.returncode

    def _read(self, timeout: float | None) -> bool:
        """Whether the agent has ended (``returncode`` set), looking for up to ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lost:
            if not select.select([self.conn], [], [], timeout)[0]:
                return False
            try:
                reply = json.loads(self.conn.recv(MESSAGE_BYTES) or b"{}")
            except (OSError, ValueError):
                reply = {}
            if "exit" in reply:
                self.returncode = int(reply["exit"])
                return True
            self._lost = True  # (the server is gone: the agent's end, from /proc)
        while process_alive(self.pid):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        self.returncode = 1
        return True

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def _request(command: list[str], env: dict, cwd=None) -> dict:
    """What the server needs to make the agent this process would start."""
    umask = os.umask(0)
    os.umask(umask)
    ignored = []
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                ignored.append(int(sig))
        except (OSError, ValueError):
            continue
    return {
        "argv": command,
        "env": env,
        "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()),
        "ppx": ppx.__file__,
        "umask": umask,
        "limits": {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS},
        "affinity": sorted(os.sched_getaffinity(0)),
        "priority": os.getpriority(os.PRIO_PROCESS, 0),
        "ignored": ignored,
    }


def _answer(conn: socket.socket, stopped: Callable[[], bool]):
    """The server's answer (a dict), `STOPPED`, or {} where none came in REPLY_S."""
    deadline = time.monotonic() + REPLY_S
    while not select.select([conn], [], [], LOOK_S)[0]:
        if stopped():
            return STOPPED
        if time.monotonic() > deadline:
            return {}
    try:
        return json.loads(conn.recv(MESSAGE_BYTES) or b"{}")
    except (OSError, ValueError):
        return {}


def _std_fds() -> tuple[list[int], list[int]]:
    """This process's stdin, stdout and stderr for the agent, and the fds opened for them: /dev/null
    for one that is closed (the caller closes those it opened)."""
    fds, opened = [], []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(None)
    for k, fd in enumerate(fds):
        if fd is None:
            fds[k] = os.open(os.devnull, os.O_RDWR)
            opened.append(fds[k])
    return fds, opened
