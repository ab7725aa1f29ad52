"""torchrun's agent forked from a server that imported torch once, not started afresh to
import it again (2-5 s of CPU a run, most of a short CPU run's time); and, for the test
suite's ``ppx`` commands, ``python -m ppx.cli`` forked from a second server that imported what
ppx's commands import (docs/testing.md). ``ppx run`` asks for an agent where
``PPX_AGENT_SERVER`` names the server's socket (`ppx.launch.served_agent`), and otherwise
starts a server of its own as it starts, which imports while the run's config is checked
(`ppx.launch.early_agent`); the tests ask for their commands (tests/helpers/served_cli.py).

The forked process is the one a new Python would be from its first line of ppx's code on
(`ppx.launch.served_process`): the command line (in /proc, where the launcher finds its ranks;
the argument area's rest is zeros), environment, working folder, ``sys.path`` (PYTHONPATH),
stdin/stdout/stderr, resource limits, umask, CPU affinity, priority and ignored signals, in a
session of its own. A request it cannot be that for is refused (`ppx.launch.served_refusals`:
another module on its path, a variable read as the server imported set otherwise), and gets a
new process; each refusal is a line in `refused_path`, which the test suite counts. The agent
server starts with ``OMP_NUM_THREADS=1``, a run's default; the command server with its
starter's environment. Its parent is the server, which reports its exit status to its asker
(reaping it only once the asker closes the connection: the pid stays held, as an unreaped
child's) and SIGTERMs it when the asker dies first, as the agent's PR_SET_PDEATHSIG would; it
dies with the server. The server is started as ``python -m ppx.launch.agent_server SOCKET
PARENT MODULE PRELOAD OPTIONS PAD`` (`start_server`): it exits with the process whose pid is
``PARENT``, at once where that one has gone already; ``MODULE`` is what it serves;
``PRELOAD`` what a server of ppx's commands imports (modules, comma-separated; ``-``: none),
and, where it names ``transformers``, transformers' model classes, for either kind of server;
``OPTIONS`` is ``early`` for a ``ppx run``'s own server (`EARLY`), else ``-``;
``PAD``, a long argument, makes room for the forked process's command line in the server's
argument area, which a fork shares."""

from __future__ import annotations

import array
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ppx.errors import UserError
from ppx.launch.processes import follow_parent
from ppx.launch.served_agent import AGENT_MODULE, CLI_MODULE, MESSAGE_BYTES
from ppx.launch.served_process import argument_area, become, command_line
from ppx.launch.served_refusals import Server, python_path, refused

TRANSFORMERS = "transformers"  # (in a server's PRELOAD: transformers' model classes, as ppx imports them)
# (its OPTIONS: a ppx run's own server, `ppx.launch.early_agent`: the socket's folder is its own,
# removed when a signal ends it, its ppx run gone; imports that printed are refused at once,
# not imported again in a new process to look, which would hold that run back a second time)
EARLY = "early"
PAD_BYTES = 8192  # room for the agent's command line (a run directory's path and torchrun's flags)
READ_S = 5.0  # a request's longest wait to be read (its ppx run sends it as it connects)


# -- the server
def serve(path: str, module: str = AGENT_MODULE, preload: list[str] = (), recheck: bool = True) -> None:
    """Listen at ``path`` (its requests wait while torch is imported), then fork a process for
    each request to run ``python -m <module>`` (torchrun's agent, or ppx's command line) until
    the process that started the server is gone."""
    parent, started = os.getppid(), dict(os.environ)
    site = [p for p in sys.path[1:] if p not in python_path(os.environ, os.getcwd())]  # (before the imports add any)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"{path}.new")
    listener.listen(64)
    os.rename(f"{path}.new", path)  # (there once it listens)
    printed = _preload(module, list(preload), path, recheck)
    imported = {k: v for k, v in os.environ.items() if started.get(k) != v}  # (set by torch's import)
    server = Server(started, imported, site, module, printed)
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
                _accept(listener, agents, [listener.fileno(), wake_r, wake_w], server, path)
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


def _preload(module: str, preload: list[str], path: str, recheck: bool = True) -> str:
    """Import what the forks would (`_imports`), their output kept out of the test's: the first
    line of what they printed, or "" (a new process prints it in its own output: a server that
    printed serves none). What only a first import on this machine prints (matplotlib building
    its font cache) is not held against it: the same imports in a new Python print nothing."""
    printed = _imported(module, preload, path)
    if printed and recheck:
        with tempfile.TemporaryDirectory() as folder:  # (its notes, if any: not this server's)
            code = "import sys; from ppx.launch.agent_server import _imports, _names; a = sys.argv; "
            code += "_imports(a[1], _names(a[2]), a[3])"
            again = subprocess.run(
                [sys.executable, "-c", code, module, ",".join(preload) or "-", os.path.join(folder, "recheck")],
                capture_output=True,
                text=True,
                timeout=300,
            )
        if again.returncode == 0 and not (again.stdout + again.stderr).strip():
            return ""
    return printed


def _imported(module: str, preload: list[str], path: str) -> str:
    """`_imports`, and the first line its imports printed, or ""."""
    with tempfile.TemporaryFile() as out:
        saved = [os.dup(1), os.dup(2)]
        try:
            for fd in (1, 2):
                os.dup2(out.fileno(), fd)
            _imports(module, preload, path)
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            for fd, was in zip((1, 2), saved):
                os.dup2(was, fd)
                os.close(was)
        out.seek(0)
        lines = out.read().decode(errors="replace").split("\n")
    return next((line.strip()[:200] for line in lines if line.strip()), "")


def _imports(module: str, preload: list[str], path: str) -> None:
    """What the agent imports before it forks its ranks (`ppx.launch.torchrun`'s
    `import_for_the_workers`), and torchrun itself; or, for a server of ppx's commands, the
    modules its starter named (``preload``: what the commands import). Either: transformers' model
    classes, where ``preload`` names `TRANSFORMERS` and it is installed (a run or command of
    model.kind=hf imports them: 4-5 s; a server that imported them for a run of another kind
    would make it wait for them)."""
    import gc

    if TRANSFORMERS in preload:
        _import_transformers(path)
    if module == AGENT_MODULE:
        import torch.distributed.run  # noqa: F401

        from ppx.launch.torchrun import import_for_the_workers

        import_for_the_workers()
        return
    for name in (n for n in preload if n != TRANSFORMERS):
        try:
            importlib.import_module(name)
        except Exception as e:  # (its commands import it themselves, and say what fails)
            _note(path, f"{name} did not import in the server: {type(e).__name__}: {e}", "")
    gc.freeze()  # (as the agent does: a command's first collection walks none of it)


def _import_transformers(path: str) -> None:
    """transformers' model classes imported as ppx imports them (offline and quiet:
    `ppx.models.hf_config.transformers` sets what transformers reads as it is imported), that
    setting taken back after: the fork's ppx sets it again where it uses transformers. None where
    it is not installed; one that fails to import is noted (`_note`)."""
    from ppx.models.hf_config import IMPORT_SETTINGS, MODEL_MODULES, transformers

    before = {k: os.environ.get(k) for k in IMPORT_SETTINGS}
    try:
        transformers()
        for name in MODEL_MODULES:
            importlib.import_module(name)
    except UserError:  # (not installed)
        pass
    except Exception as e:
        _note(path, f"transformers did not import in the server: {type(e).__name__}: {e}", "")
    finally:  # (what torch's import set stays: `Server.imported`)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


def _accept(listener: socket.socket, agents: dict, server_fds: list[int], server: Server, path: str) -> None:
    """Read one request and fork its process (the answer: its pid), or note why not (`_note`,
    before the answer) and answer that; ``path``: the server's socket."""
    conn, _ = listener.accept()
    conn.settimeout(READ_S)  # (a stalled ppx run holds up no other)
    fds, request = array.array("i"), None
    try:
        data, ancillary, _, _ = conn.recvmsg(MESSAGE_BYTES, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        request = json.loads(data)
        command_bytes = len(command_line(request.get("argv") or []))
        why = refused(request, len(fds), server, argument_area()[1], command_bytes)
        why = why or ("its ppx run is gone" if _gone(conn) else None)
        pid = None if why else os.fork()
        if pid == 0:
            try:
                others = [c.fileno() for c in agents.values() if c is not None]
                become(request, list(fds), [*server_fds, conn.fileno(), *others], server)
            finally:  # (never back into the server's loop)
                os._exit(70)
    except Exception as e:
        why, pid = f"{type(e).__name__}: {e}", None
    finally:
        for fd in fds:
            os.close(fd)
    if pid is not None:
        agents[pid] = conn
    else:
        argv = request.get("argv") if isinstance(request, dict) else None
        _note(path, why, " ".join(map(str, argv)) if isinstance(argv, list) else "")
    try:
        conn.send(json.dumps({"pid": pid} if pid is not None else {"error": why}).encode())
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


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def start_server(
    path: Path, module: str = AGENT_MODULE, preload: list[str] = (), env: dict | None = None, early: bool = False
) -> subprocess.Popen:
    """A server at ``path`` (it exits with the process that started it) of ``module``'s
    processes, with ``env`` (default: this process's environment; an agent server's with
    OMP_NUM_THREADS=1, a run's own default, `runtime.threads_per_rank`); a server of ppx's
    commands imports the modules ``preload`` names first, and either imports transformers'
    model classes where it names `TRANSFORMERS`. ``early``: a ``ppx run``'s own (`EARLY`),
    its own output (not its forks') going nowhere."""
    command = [
        sys.executable,
        "-m",
        __name__,
        str(path),
        str(os.getpid()),
        module,
        ",".join(preload) or "-",
        EARLY if early else "-",
        "-" * PAD_BYTES,
    ]
    env = dict(os.environ if env is None else env, **({"OMP_NUM_THREADS": "1"} if module == AGENT_MODULE else {}))
    out = subprocess.DEVNULL if early else None
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)


def _remove_on_signal(path: str) -> None:
    """An early server's end by a signal (SIGTERM: its ppx run died, `follow_parent`) removes
    its socket's folder, which no one else would (its agents die with it)."""

    server = os.getpid()

    def end(signum, frame):
        if os.getpid() != server:  # (a fork before it took a new Python's handlers: as SIG_DFL)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end)


def _names(text: str) -> list[str]:
    """The modules a server's PRELOAD argument names (comma-separated; ``-``: none)."""
    return [n for n in text.split(",") if n not in ("", "-")]


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
    early = sys.argv[5] == EARLY
    if early:
        _remove_on_signal(sys.argv[1])
    if follow_parent(sys.argv[2]) and os.getppid() == int(sys.argv[2]):
        serve(sys.argv[1], sys.argv[3], _names(sys.argv[4]), recheck=not early)
    elif early:
        shutil.rmtree(os.path.dirname(sys.argv[1]), ignore_errors=True)
