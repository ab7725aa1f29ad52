"""torchrun's agent forked from a server that imported torch once, not started afresh to
import it again (2-5 s of CPU a run, most of a short CPU run's time): the test suite's
(docs/testing.md). Where ``PPX_AGENT_SERVER`` names such a server's socket, ``ppx run``
starts a CPU job's torchrun (``--start-method=fork``) through it (`start_agent`); anything
else, or a server that cannot serve, gets a plain process.

The forked agent is the process a plain one would be from its first line of ppx's code on:
``ppx run``'s command line (in /proc, where the launcher finds its ranks), environment,
working folder, ``sys.path`` (PYTHONPATH), stdin/stdout/stderr, open-file limit and umask, in
a session of its own. Its parent is the server, which reports its exit status to ``ppx run``
and SIGTERMs it when ``ppx run`` dies, as the agent's PR_SET_PDEATHSIG would. The server is
started as ``python -m ppx.launch.agent_server SOCKET PAD``: ``PAD``, a long argument, makes
room for the agent's command line in the server's own argument area, which a fork shares."""

from __future__ import annotations

import array
import ctypes
import io
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import ppx
from ppx.launch.processes import FORK, stat_fields

SERVER_ENV = "PPX_AGENT_SERVER"
AGENT_MODULE = "ppx.launch.torchrun"
PAD_BYTES = 8192  # room for the agent's command line (a run directory's path and torchrun's flags)
REPLY_S = 120.0  # a server's longest wait to answer (its imports, on a slow machine)
MESSAGE_BYTES = 1 << 20  # a request's most bytes (the environment)
_LIMITS = [name for name in dir(resource) if name.startswith("RLIMIT_")]  # (ulimit's: files, file size, ...)


def start_agent(command: list[str], env: dict, server: str | None = None):
    """The torchrun ``command`` started in a session of its own with ``env``: a
    `subprocess.Popen`, or where ``server`` (default: ``PPX_AGENT_SERVER`` of ``env``) serves
    it, a `ServedAgent` forked there."""
    server = server if server is not None else env.get(SERVER_ENV)
    if server and command[:3] == [sys.executable, "-m", AGENT_MODULE] and FORK in command:
        agent = ServedAgent.request(server, command, env)
        if agent is not None:
            return agent
    return subprocess.Popen(command, env=env, start_new_session=True)


class ServedAgent:
    """An agent a server forked: Popen's ``pid``, ``returncode``, ``poll``, ``wait`` and
    ``send_signal``, its exit status read from the server's connection."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None

    @classmethod
    def request(cls, server: str, command: list[str], env: dict) -> ServedAgent | None:
        """The agent forked for ``command``, or None where the server is not there or refuses."""
        umask = os.umask(0)
        os.umask(umask)
        request = {
            "argv": command,
            "env": env,
            "cwd": os.getcwd(),
            "ppx": ppx.__file__,
            "umask": umask,
            "limits": {name: resource.getrlimit(getattr(resource, name)) for name in _LIMITS},
        }
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(server)
            conn.sendmsg([json.dumps(request).encode()], [_fds_message(_std_fds())])
            conn.settimeout(REPLY_S)
            reply = json.loads(conn.recv(MESSAGE_BYTES) or b"{}")
        except (OSError, ValueError):
            conn.close()
            return None
        if "pid" not in reply:
            conn.close()
            return None
        conn.settimeout(None)
        return cls(conn, int(reply["pid"]))

    def poll(self) -> int | None:
        return self.wait(0.0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (Popen's: -N for a signal N); raises TimeoutExpired after ``timeout`` s."""
        if self.returncode is not None:
            return self.returncode
        if not select.select([self.conn], [], [], timeout)[0]:
            if timeout == 0.0:
                return None  # (poll)
            raise subprocess.TimeoutExpired(AGENT_MODULE, timeout)
        try:
            reply = json.loads(self.conn.recv(MESSAGE_BYTES) or b"{}")
        except (OSError, ValueError):
            reply = {}
        self.conn.close()
        self.returncode = int(reply.get("exit", 1))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def _std_fds() -> list[int]:
    """This process's stdin, stdout and stderr for the agent: /dev/null for one that is closed."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _fds_message(fds: list[int]):
    return (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))


# -- the server
def serve(path: str) -> None:
    """Listen at ``path`` (its requests wait while torch is imported), then fork an agent for
    each request until the process that started the server is gone."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    agents: dict[int, socket.socket | None] = {}  # pid -> its ppx run's connection (None: that one died)
    while os.getppid() == parent:
        conns = [c for c in agents.values() if c is not None]
        ready = select.select([listener, wake_r, *conns], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(agents)
        if listener in ready:
            try:
                _accept(listener, agents, [listener.fileno(), wake_r, wake_w])
            except OSError as e:  # (a ppx run gone before its answer, no process to fork: it is not served)
                print(f"ppx agent server: a request was not served: {e}", file=sys.stderr, flush=True)
        for pid, conn in list(agents.items()):
            if conn in ready and _closed(conn):  # its ppx run died: as PR_SET_PDEATHSIG would
                _kill(pid, signal.SIGTERM)
                conn.close()
                agents[pid] = None
    for pid in agents:
        _kill(pid, signal.SIGTERM)


def _closed(conn: socket.socket) -> bool:
    try:
        return conn.recv(1) == b""
    except OSError:
        return True


def _preload() -> None:
    """What the agent imports before it forks its ranks (`ppx.launch.torchrun`'s
    `_import_for_the_workers`), and torchrun itself."""
    import gc

    import torch._dynamo  # noqa: F401
    import torch.distributed.run  # noqa: F401

    import ppx.launch.supervisor  # noqa: F401
    import ppx.launch.worker  # noqa: F401

    gc.freeze()


def _reap(agents: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = agents.pop(pid, None)
        if conn is not None:
            try:
                conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
            except OSError:
                pass
            conn.close()


def _accept(listener: socket.socket, agents: dict, server_fds: list[int]) -> None:
    """Read one request and fork its agent (the answer: its pid), or answer why not."""
    conn, _ = listener.accept()
    fds = array.array("i")
    try:
        data, ancillary, _, _ = conn.recvmsg(MESSAGE_BYTES, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        request = json.loads(data)
        refused = _refused(request, len(fds))
        pid = None if refused else os.fork()
        if pid == 0:
            others = [c.fileno() for c in agents.values() if c is not None]
            _agent(request, list(fds), [*server_fds, conn.fileno(), *others])
    except (OSError, ValueError) as e:
        refused, pid = f"{type(e).__name__}: {e}", None
    finally:
        for fd in fds:
            os.close(fd)
    if pid is not None:
        agents[pid] = conn
    try:
        conn.send(json.dumps({"pid": pid} if pid is not None else {"error": refused}).encode())
    finally:
        if pid is None:
            conn.close()


def _refused(request: dict, fds: int) -> str | None:
    """Why the server will not fork the agent ``request`` asks for, or None."""
    argv = request.get("argv") or []
    if argv[:3] != [sys.executable, "-m", AGENT_MODULE]:
        return f"not {sys.executable} -m {AGENT_MODULE}"
    if request.get("ppx") != ppx.__file__:
        return f"ppx is {request.get('ppx')} there, {ppx.__file__} here"
    if fds != 3:
        return "stdin, stdout and stderr not passed"
    if len(b"\0".join(a.encode() for a in argv)) + 1 > _argument_area()[1]:
        return "the command line is longer than the server's PAD"
    return None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -- the forked agent
def _agent(request: dict, fds: list[int], server_fds: list[int]) -> None:
    """In the fork: become the agent the request's command would start, run it and exit."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.umask(request["umask"])
        _set_limits(request["limits"])
        argv, env = request["argv"], request["env"]
        os.chdir(request["cwd"])
        _set_environment(env)
        _set_command_line(argv)
        _std_streams(env)
        from ppx.launch import torchrun

        sys.argv = [torchrun.__file__, *argv[3:]]
        code = torchrun.run(argv[3:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _set_limits(limits: dict) -> None:
    """``ppx run``'s resource limits (``ulimit``) here, none above the server's own hard ones."""
    for name, (soft, hard) in limits.items():
        kind = getattr(resource, name)
        hard = _lower(hard, resource.getrlimit(kind)[1])
        try:
            resource.setrlimit(kind, (_lower(soft, hard), hard))
        except (OSError, ValueError):  # (one this process cannot take: the server's stays)
            pass


def _lower(a: int, b: int) -> int:
    """The lower of two limits, RLIM_INFINITY being none."""
    return b if a == resource.RLIM_INFINITY else a if b == resource.RLIM_INFINITY else min(a, b)


def _set_environment(env: dict) -> None:
    """``env`` as this process's environment, and ``sys.path`` as a Python started with it in
    the working folder would have it: the folder (``-m``), PYTHONPATH, then the site's."""
    server_path = _python_path(os.environ)
    os.environ.clear()
    os.environ.update(env)
    own = _python_path(env)
    site = [p for p in sys.path[1:] if p not in server_path]
    sys.path[:] = [os.getcwd(), *own, *site]
    sys.path_importer_cache.clear()


def _python_path(env) -> list[str]:
    """PYTHONPATH's folders as `site` puts them on ``sys.path``: absolute."""
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _std_streams(env: dict) -> None:
    """sys.stdout and sys.stderr anew on fds 1 and 2, buffered as a new Python's would be."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(  # (CPython's create_stdio: stderr line-buffered, a tty too)
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=not unbuffered and (name == "stderr" or raw.isatty()),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _argument_area() -> tuple[int, int]:
    """(address, bytes) of this process's argument strings, which /proc/<pid>/cmdline reads."""
    fields = stat_fields(os.getpid())  # arg_start and arg_end: /proc/<pid>/stat's fields 48 and 49
    start, end = int(fields[45]), int(fields[46])
    return start, end - start


def _set_command_line(argv: list[str]) -> None:
    """Write ``argv`` over this process's argument area (the rest zeros): /proc/<pid>/cmdline
    then reads it, its forks' too."""
    start, size = _argument_area()
    data = b"\0".join(a.encode() for a in argv) + b"\0"
    ctypes.memmove(start, data.ljust(size, b"\0"), size)


def start_server(path: Path) -> subprocess.Popen:
    """A server at ``path`` (it exits with the process that started it)."""
    command = [sys.executable, "-m", __name__, str(path), "-" * PAD_BYTES]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    """Until the server at ``path`` listens (its requests then wait for its imports)."""
    deadline = time.monotonic() + timeout_s
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


if __name__ == "__main__":
    from ppx.launch.processes import follow_parent

    follow_parent(str(os.getppid()))
    serve(sys.argv[1])
