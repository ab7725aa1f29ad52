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
import importlib.machinery
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import ppx
from ppx.launch.processes import follow_parent
from ppx.launch.served_agent import AGENT_MODULE, CLI_MODULE, MESSAGE_BYTES
from ppx.launch.served_process import argument_area, become, command_line, python_path

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
def serve(path: str, module: str = AGENT_MODULE) -> None:
    """Listen at ``path`` (its requests wait while torch is imported), then fork a process for
    each request to run ``python -m <module>`` (torchrun's agent, or ppx's command line) until
    the process that started the server is gone."""
    parent, server_path, started = os.getppid(), python_path(os.environ), dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"{path}.new")
    listener.listen(64)
    os.rename(f"{path}.new", path)  # (there once it listens)
    _preload(module)
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
                _accept(
                    listener,
                    agents,
                    [listener.fileno(), wake_r, wake_w],
                    (started, imported, server_path, module),
                    path,
                )
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


OPTIONAL = (
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
)  # (model.kind=hf's, where installed)


def _preload(module: str) -> None:
    """What the agent imports before it forks its ranks (`ppx.launch.torchrun`'s
    `import_for_the_workers`), and torchrun itself; or what ppx's commands import: torch (and
    torch._dynamo, which its fake tensors and FLOP counter import at their first use), OmegaConf
    and matplotlib (drawn with Agg, as ppx draws). Both: transformers' model classes, where it
    is installed (a run or command of model.kind=hf imports them: 4-5 s)."""
    import importlib

    for name in OPTIONAL:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if module == AGENT_MODULE:
        import torch.distributed.run  # noqa: F401

        from ppx.launch.torchrun import import_for_the_workers

        import_for_the_workers()
        return
    import gc
    import pkgutil

    import matplotlib

    matplotlib.use("Agg")
    for name in ("matplotlib.pyplot", "torch._dynamo", "torch._subclasses.fake_tensor", "torch.utils.flop_counter"):
        importlib.import_module(name)
    import ppx.commands

    for info in pkgutil.iter_modules(ppx.commands.__path__, "ppx.commands."):
        importlib.import_module(info.name)
    gc.freeze()  # (as the agent does: a command's first collection walks none of it)


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
        refused = _refused(request, len(fds), *environment) or ("its ppx run is gone" if _gone(conn) else None)
        pid = None if refused else os.fork()
        if pid == 0:
            others = [c.fileno() for c in agents.values() if c is not None]
            become(request, list(fds), [*server_fds, conn.fileno(), *others], environment)
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


def _refused(request: dict, fds: int, started: dict, imported: dict, server_path: list[str], module: str) -> str | None:
    """Why the server will not fork the process ``request`` asks for, or None (``started``: the
    server's environment as it started, before torch's import; ``imported``: what that import
    set, which a process that imported torch before it started ppx run hands on as it is;
    ``server_path``: the server's PYTHONPATH folders; ``module``: what it runs)."""
    argv, env = request.get("argv") or [], request.get("env") or {}
    if argv[:3] != [sys.executable, "-m", module]:
        return f"not {sys.executable} -m {module}"
    if module == AGENT_MODULE and request.get("ppx") != ppx.__file__:
        return f"ppx is {request.get('ppx')} there, {ppx.__file__} here"
    if fds != 3:
        return "stdin, stdout and stderr not passed"
    if len(command_line(argv)) > argument_area()[1]:
        return "the command line is longer than the server's PAD"
    names = {k for k in (*env, *started) if k in IMPORT_TIME or k.startswith(IMPORT_TIME_PREFIXES)}
    differ = sorted(k for k in names if env.get(k) != started.get(k) and (k not in imported or env[k] != imported[k]))
    if differ:
        return f"{', '.join(differ)} not as the server imported torch with"
    if (
        env.get("PYTHONSAFEPATH")
        or env.get("PYTHONHOME")
        or env.get("PYTHONNOUSERSITE") != started.get("PYTHONNOUSERSITE")
    ):
        return "PYTHONSAFEPATH, PYTHONHOME or PYTHONNOUSERSITE set"
    return _shadowed(request.get("cwd") or "/", env, server_path)


def _shadowed(cwd: str, env: dict, server_path: list[str]) -> str | None:
    """Why a module this server imported would not be that one in a new Python started in
    ``cwd`` with ``env``, or None: its ``sys.path`` (the working folder, PYTHONPATH's, the
    site's, as `ppx.launch.served_process` sets it) finds another there first (a test's stand-in
    for a package, another checkout's ppx) or none."""
    path = [cwd, *python_path(env), *(p for p in sys.path[1:] if p not in server_path)]
    for name, mod in list(sys.modules.items()):
        spec = getattr(mod, "__spec__", None)
        if "." in name or spec is None or spec.name != name or not spec.has_location:
            continue  # (a built-in or frozen module is found before any folder; a made one is none's)
        found = None
        for finder in sys.meta_path:  # (as import finds it: the path's finder on that path)
            if finder is importlib.machinery.PathFinder:
                found = finder.find_spec(name, path)
            elif hasattr(finder, "find_spec"):
                found = finder.find_spec(name, None)
            if found is not None:
                break
        if found is None or found.origin != spec.origin:
            return f"{name} is {found.origin if found else 'not found'} there, {spec.origin} here"
    return None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def start_server(path: Path, module: str = AGENT_MODULE) -> subprocess.Popen:
    """A server at ``path`` (it exits with the process that started it) of ``module``'s
    processes, with this process's environment; an agent server's with OMP_NUM_THREADS=1 (a
    run's own default, `runtime.threads_per_rank`)."""
    command = [sys.executable, "-m", __name__, str(path), str(os.getpid()), module, "-" * PAD_BYTES]
    env = dict(os.environ, **({"OMP_NUM_THREADS": "1"} if module == AGENT_MODULE else {}))
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    """Until the server at ``path`` listens (its requests then wait for its imports)."""
    deadline = time.monotonic() + timeout_s
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


if __name__ == "__main__":
    # (the pid its starter gave, not getppid(): a starter gone before this line leaves this
    # process init's child, which getppid() would then name, and it had served on forever)
    if sys.argv[3] not in (AGENT_MODULE, CLI_MODULE):
        sys.exit(f"agent_server: serves {AGENT_MODULE} or {CLI_MODULE}, not {sys.argv[3]}")
    if follow_parent(sys.argv[2]) and os.getppid() == int(sys.argv[2]):
        serve(sys.argv[1], sys.argv[3])
