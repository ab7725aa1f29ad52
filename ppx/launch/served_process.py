"""The process a request to the agent server (`ppx.launch.agent_server`) asks for, become in
the server's fork: ``ppx run``'s command line, environment, working folder, ``sys.path``,
stdin/stdout/stderr, resource limits, umask, CPU affinity, priority and ignored signals, in a
session of its own; then torchrun's agent (`ppx.launch.torchrun`) or, for the test suite's
command server, ``python -m ppx.cli``, as a new Python would run it to its end."""

from __future__ import annotations

import ctypes
import io
import os
import resource
import signal
import sys

from ppx.launch.processes import follow_parent, stat_fields
from ppx.launch.served_agent import AGENT_MODULE, CLI_MODULE


def become(request: dict, fds: list[int], server_fds: list[int], environment: tuple) -> None:
    """In the fork: become the process the request's command would start, run it and exit
    (``environment``: the server's as it started, what its imports set, its PYTHONPATH's folders)."""
    code, argv = 1, request.get("argv") or []
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
        env = request["env"]
        os.chdir(request["cwd"])
        _set_environment(env, environment[1], environment[2])
        _setcommand_line(argv)
        _std_streams(env)
        code = _run(argv)
    except SystemExit as e:  # (as Python ends on one)
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        if argv[2:3] == [CLI_MODULE]:
            _finalize()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _run(argv: list[str]) -> int:
    """``python -m <module> <args>``'s run of ``argv`` here: torchrun's agent's exit code, or
    ppx's command line run as ``__main__`` (its exit code comes as SystemExit)."""
    if argv[2] == AGENT_MODULE:
        from ppx.launch import torchrun

        sys.argv = [torchrun.__file__, *argv[3:]]
        return torchrun.run(argv[3:])
    import runpy

    sys.argv = [argv[2], *argv[3:]]  # (runpy puts the module's file first, as -m does)
    runpy.run_module(CLI_MODULE, run_name="__main__", alter_sys=True)
    return 0


def _finalize() -> None:
    """What Python does as it ends, before its streams are flushed: it waits for the threads
    that are not daemons, then runs the atexit functions."""
    import atexit
    import threading

    try:
        threading._shutdown()  # (Python's own call at its end)
    except BaseException:  # (a Ctrl-C while waiting: Python goes on to atexit too)
        pass
    atexit._run_exitfuncs()


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
    own = python_path(env)
    site = [p for p in sys.path[1:] if p not in server_path]
    sys.path[:] = [os.getcwd(), *own, *site]
    sys.path_importer_cache.clear()


def python_path(env) -> list[str]:
    """PYTHONPATH's folders as `site` puts them on ``sys.path``: absolute."""
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _std_streams(env: dict) -> None:
    """sys.stdin, sys.stdout and sys.stderr anew on fds 0, 1 and 2, buffered as a new Python's would be."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    raw = io.FileIO(0, "r", closefd=False)
    old = sys.stdin
    stdin = io.TextIOWrapper(
        io.BufferedReader(raw), encoding=old.encoding, errors=old.errors, line_buffering=raw.isatty()
    )
    sys.stdin = sys.__stdin__ = stdin
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


def argument_area() -> tuple[int, int]:
    """(address, bytes) of this process's argument strings, which /proc/<pid>/cmdline reads."""
    fields = stat_fields(os.getpid())  # arg_start and arg_end: /proc/<pid>/stat's fields 48 and 49
    start, end = int(fields[45]), int(fields[46])
    return start, end - start


def _setcommand_line(argv: list[str]) -> None:
    """Write ``argv`` over this process's argument area (the rest zeros): /proc/<pid>/cmdline
    then reads it, its forks' too."""
    start, size = argument_area()
    ctypes.memmove(start, command_line(argv).ljust(size, b"\0"), size)


def command_line(argv: list[str]) -> bytes:
    """``argv`` as /proc/<pid>/cmdline holds it: each argument's bytes, each ended by a zero."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv)
