"""torchrun's agent forked from a server that imported torch once, not started afresh to
import it again (2-5 s of CPU a run, most of a short CPU run's time): the test suite's
(docs/testing.md). ``ppx run`` asks for one where ``PPX_AGENT_SERVER`` names the server's
socket (`ppx.launch.served_agent`).

The forked agent is the process a plain one would be from its first line of ppx's code on:
``ppx run``'s command line (in /proc, where the launcher finds its ranks; the argument area's
rest is zeros), environment, working folder, ``sys.path`` (PYTHONPATH), stdin/stdout/stderr,
resource limits, umask, CPU affinity, priority and ignored signals, in a session of its own.
What Python and torch read from the environment as torch is imported (thread counts, log
settings, the hash seed) is the server's: a request whose values differ is refused (a plain
agent then), and the server starts with ``OMP_NUM_THREADS=1``, a run's default. Its parent is
the server, which reports its exit status to ``ppx run`` (reaping it only once ``ppx run``
closes the connection: the pid stays held, as an unreaped child's) and SIGTERMs it when ``ppx
run`` dies first, as the agent's PR_SET_PDEATHSIG would; the agent dies with the server. The
server is started as ``python -m ppx.launch.agent_server SOCKET PARENT PAD`` (`start_server`):
it exits with the process whose pid is ``PARENT``, at once where that one has gone already;
``PAD``, a long argument, makes room for the agent's command line in the server's argument
area, which a fork shares."""

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
from ppx.launch.processes import follow_parent, stat_fields
from ppx.launch.served_agent import AGENT_MODULE, MESSAGE_BYTES

PAD_BYTES = 8192  # room for the agent's command line (a run directory's path and torchrun's flags)
READ_S = 5.0  # a request's longest wait to be read (its ppx run sends it as it connects)
# what Python, torch and its libraries read from the environment as torch is imported
IMPORT_TIME = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "LOGLEVEL",
    "TORCH_LOGS",
    "TORCH_TRACE",
    "TORCH_COMPILE_DEBUG",
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
)
IMPORT_TIME_PREFIXES = ("TORCHDYNAMO_", "TORCHINDUCTOR_", "KMP_", "GOMP_")


# -- the server
def serve(path: str) -> None:
    """Listen at ``path`` (its requests wait while torch is imported), then fork an agent for
    each request until the process that started the server is gone."""
    parent, server_path, started = os.getppid(), _python_path(os.environ), dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"{path}.new")
    listener.listen(64)
    os.rename(f"{path}.new", path)  # (there once it listens)
    _preload()
    imported = {k: v for k, v in os.environ.items() if started.get(k) != v}  # (set by torch's import)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    agents: dict[int, socket.socket | None] = {}  # pid -> its ppx run's connection (None: that one died)
    reported: set[int] = set()  # agents ended, their exit sent, held unreaped until their ppx run lets go
    failed = None  # (the last request's failure, noted once however often it repeats)
    while os.getppid() == parent:
        conns = [c for c in agents.values() if c is not None]
        ready = select.select([listener, wake_r, *conns], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        _report(agents, reported)
        if listener in ready:
            try:
                _accept(listener, agents, [listener.fileno(), wake_r, wake_w], (started, imported, server_path), path)
                failed = None
            except Exception as e:  # (the request is not served: its ppx run starts a plain agent)
                if f"{e!r}" != failed:
                    _note(path, f"{type(e).__name__}: {e}", "")
                failed = f"{e!r}"
        for pid, conn in list(agents.items()):
            if conn is None or conn not in ready or not _closed(conn):
                continue
            conn.close()
            if pid in reported:  # (ended, and its ppx run has its exit status)
                os.waitpid(pid, 0)
                reported.discard(pid)
                del agents[pid]
            else:  # its ppx run died first: as PR_SET_PDEATHSIG would
                _kill(pid, signal.SIGTERM)
                agents[pid] = None
    for pid in agents:
        _kill(pid, signal.SIGTERM)


def refused_path(path) -> Path:
    """Where the server at ``path`` notes the requests it did not serve (`_note`)."""
    return Path(f"{path}.refused")


def _note(path: str, reason: str, command: str) -> None:
    """A line for a request not served (its ppx run starts a plain agent), in `refused_path`:
    why, a tab, its command; the test suite counts them (tests/conftest.py)."""
    line = "\t".join(" ".join(x.split()) for x in (reason, command))
    try:
        with open(refused_path(path), "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(line + "\n")
    except OSError:  # (a full disk: the server serves on)
        pass


def _closed(conn: socket.socket) -> bool:
    try:
        return conn.recv(1) == b""
    except OSError:
        return True


def _preload() -> None:
    """What the agent imports before it forks its ranks (`ppx.launch.torchrun`'s
    `import_for_the_workers`), and torchrun itself."""
    import torch.distributed.run  # noqa: F401

    from ppx.launch.torchrun import import_for_the_workers

    import_for_the_workers()


def _report(agents: dict, reported: set[int]) -> None:
    """Each agent that ended: its exit status to its ppx run, the agent left unreaped (one whose
    ppx run is gone: reaped)."""
    for pid, conn in list(agents.items()):
        if conn is None:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                del agents[pid]
            continue
        if pid in reported:
            continue
        ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if ended is None:
            continue
        code = ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
        reported.add(pid)
        try:
            conn.send(json.dumps({"exit": code}).encode())
        except OSError:
            pass


def _accept(listener: socket.socket, agents: dict, server_fds: list[int], environment: tuple, path: str) -> None:
    """Read one request and fork its agent (the answer: its pid), or note why not (`_note`,
    before the answer) and answer that. ``environment``: the server's as it started, what its
    imports set, its PYTHONPATH's folders; ``path``: the server's socket."""
    conn, _ = listener.accept()
    conn.settimeout(READ_S)  # (a stalled ppx run holds up no other)
    fds, request = array.array("i"), None
    try:
        data, ancillary, _, _ = conn.recvmsg(MESSAGE_BYTES, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        request = json.loads(data)
        refused = _refused(request, len(fds), *environment[:2]) or ("its ppx run is gone" if _gone(conn) else None)
        pid = None if refused else os.fork()
        if pid == 0:
            others = [c.fileno() for c in agents.values() if c is not None]
            _agent(request, list(fds), [*server_fds, conn.fileno(), *others], environment)
    except Exception as e:
        refused, pid = f"{type(e).__name__}: {e}", None
    finally:
        for fd in fds:
            os.close(fd)
    if pid is not None:
        agents[pid] = conn
    else:
        argv = request.get("argv") if isinstance(request, dict) else None
        _note(path, refused, " ".join(map(str, argv)) if isinstance(argv, list) else "")
    try:
        conn.send(json.dumps({"pid": pid} if pid is not None else {"error": refused}).encode())
    except OSError:
        pass  # (its ppx run is gone: the agent is ended at the next look)
    if pid is None:
        conn.close()


def _gone(conn: socket.socket) -> bool:
    """Whether the request's ppx run has closed its end (it gave up waiting, or died): its end
    readable, with nothing to read (it sends one message only)."""
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _refused(request: dict, fds: int, started: dict, imported: dict) -> str | None:
    """Why the server will not fork the agent ``request`` asks for, or None (``started``: the
    server's environment as it started, before torch's import; ``imported``: what that import
    set, which a process that imported torch before it started ppx run hands on as it is)."""
    argv, env = request.get("argv") or [], request.get("env") or {}
    if argv[:3] != [sys.executable, "-m", AGENT_MODULE]:
        return f"not {sys.executable} -m {AGENT_MODULE}"
    if request.get("ppx") != ppx.__file__:
        return f"ppx is {request.get('ppx')} there, {ppx.__file__} here"
    if fds != 3:
        return "stdin, stdout and stderr not passed"
    if len(_command_line(argv)) > _argument_area()[1]:
        return "the command line is longer than the server's PAD"
    names = {k for k in (*env, *started) if k in IMPORT_TIME or k.startswith(IMPORT_TIME_PREFIXES)}
    differ = sorted(k for k in names if env.get(k) != started.get(k) and (k not in imported or env[k] != imported[k]))
    if differ:
        return f"{', '.join(differ)} not as the server imported torch with"
    return None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -- the forked agent
def _agent(request: dict, fds: list[int], server_fds: list[int], environment: tuple) -> None:
    """In the fork: become the agent the request's command would start, run it and exit."""
    code = 1
    try:
        server = os.getppid()
        os.setsid()
        if not follow_parent(str(server)) or os.getppid() != server:  # (dies with the server)
            os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _process_state(request)
        argv, env = request["argv"], request["env"]
        os.chdir(request["cwd"])
        _set_environment(env, *environment[1:])
        _set_command_line(argv)
        _std_streams(env)
        from ppx.launch import torchrun

        sys.argv = [torchrun.__file__, *argv[3:]]
        code = torchrun.run(argv[3:])
    except SystemExit as e:  # (as Python ends on one)
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _process_state(request: dict) -> None:
    """``ppx run``'s umask, resource limits (none above the server's own hard ones), CPU
    affinity, priority (where this process may take it) and ignored signals here."""
    os.umask(request["umask"])
    for name, (soft, hard) in request["limits"].items():
        kind = getattr(resource, name)
        hard = _lower(hard, resource.getrlimit(kind)[1])
        try:
            resource.setrlimit(kind, (_lower(soft, hard), hard))
        except (OSError, ValueError):  # (one this process cannot take: the server's stays)
            pass
    for set_it in (
        lambda: os.sched_setaffinity(0, request["affinity"]),
        lambda: os.setpriority(os.PRIO_PROCESS, 0, request["priority"]),
    ):
        try:
            set_it()
        except OSError:
            pass
    for sig in request["ignored"]:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            pass


def _lower(a: int, b: int) -> int:
    """The lower of two limits, RLIM_INFINITY being none."""
    return b if a == resource.RLIM_INFINITY else a if b == resource.RLIM_INFINITY else min(a, b)


def _set_environment(env: dict, imported: dict, server_path: list[str]) -> None:
    """``env`` as this process's environment, with what importing torch set there (``imported``:
    a plain agent's import sets it too), and ``sys.path`` as a Python started with it in the
    working folder would have it: the folder (``-m``), PYTHONPATH, then the site's (the
    server's own PYTHONPATH, ``server_path``, left out)."""
    os.environ.clear()
    os.environ.update({**imported, **env})
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
    ctypes.memmove(start, _command_line(argv).ljust(size, b"\0"), size)


def _command_line(argv: list[str]) -> bytes:
    """``argv`` as /proc/<pid>/cmdline holds it: each argument's bytes, each ended by a zero."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv)


def start_server(path: Path) -> subprocess.Popen:
    """A server at ``path`` (it exits with the process that started it), with this process's
    environment and OMP_NUM_THREADS=1 (a run's own default, `runtime.threads_per_rank`)."""
    command = [sys.executable, "-m", __name__, str(path), str(os.getpid()), "-" * PAD_BYTES]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    """Until the server at ``path`` listens (its requests then wait for its imports)."""
    deadline = time.monotonic() + timeout_s
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


if __name__ == "__main__":
    # (the pid its starter gave, not getppid(): a starter gone before this line leaves this
    # process init's child, which getppid() would then name, and it had served on forever)
    if follow_parent(sys.argv[2]) and os.getppid() == int(sys.argv[2]):
        serve(sys.argv[1])
