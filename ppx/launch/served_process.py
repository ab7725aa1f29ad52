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
from ppx.launch.served_refusals import Server, python_path


def become(request: dict, fds: list[int], server_fds: list[int], server: Server) -> None:
    """In the fork: become the process the request's command would start, run it and exit."""
    code, interrupted, argv = 1, False, request.get("argv") or []
    try:
        try:
            parent = os.getppid()
            os.setsid()
            if not follow_parent(str(parent)) or os.getppid() != parent:  # (dies with the server)
                os._exit(1)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for sig in (signal.SIGTERM, signal.SIGHUP):  # (a new Python's: not an early server's, `EARLY`)
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for fd in server_fds:
                os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            _process_state(request)
            env = request["env"]
            os.chdir(request["cwd"])
            _set_environment(env, server.imported, server.site)
            _set_command_line(argv)
            _std_streams(env)
            code = _run(argv)
        except SystemExit as e:  # (as Python ends on one)
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except KeyboardInterrupt as e:  # (Python prints it, then ends by SIGINT once it has finished)
            _print_uncaught(e)
            interrupted = True
        except BaseException as e:
            _print_uncaught(e)
        if argv[2:3] == [CLI_MODULE]:
            _finalize()
        code = _flush(code)
    except BaseException:  # (never back into the server's loop)
        pass
    finally:
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 128 + signal.SIGINT
        os._exit(code & 0xFF if isinstance(code, int) else 1)


def _flush(code: int) -> int:
    """Both streams flushed, as Python flushes them at its end: a stdout that will not take its
    last bytes (its reader gone) turns a success into exit status 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            if stream is sys.stdout and code == 0:
                code = 120
    return code


def _run(argv: list[str]) -> int:
    """``python -m <module> <args>``'s run of ``argv`` here: torchrun's agent's exit code, or
    ppx's command line run as ``-m`` runs it, in a new ``__main__`` (its exit code comes as
    SystemExit)."""
    if argv[2] == AGENT_MODULE:
        from ppx.launch import torchrun

        sys.argv = [torchrun.__file__, *argv[3:]]
        return torchrun.run(argv[3:])
    import runpy
    import types

    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.argv = [argv[2], *argv[3:]]  # (runpy puts the module's file first, as -m does)
    runpy._run_module_as_main(CLI_MODULE)  # (-m's own call: __main__ and sys.argv stay as set)
    return 0


def _print_uncaught(e: BaseException) -> None:
    """An exception no code caught, as Python prints it (sys.excepthook): its traceback from
    runpy's first frame, as ``-m`` shows it."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name != "_run_module_as_main":
        tb = tb.tb_next
    e = e.with_traceback(tb or e.__traceback__)  # (the hook prints the exception's own)
    sys.excepthook(type(e), e, e.__traceback__)


def _finalize() -> None:
    """What Python does as it ends, before its streams are flushed: it waits for the threads
    that are not daemons, then runs the atexit functions (the server's imports' among them, as
    a new process's imports register them too). Not done: the interpreter's teardown (objects
    left in modules are not collected)."""
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


def _set_environment(env: dict, imported: dict, site: list[str]) -> None:
    """``env`` as this process's environment, with what the server's imports set there
    (``imported``: a new process's imports set it too), and ``sys.path`` as a Python started
    with it in the working folder would have it: the folder (``-m``), PYTHONPATH, then the
    site's (``site``: the server's, less its own PYTHONPATH)."""
    os.environ.clear()
    os.environ.update({**imported, **env})
    sys.path[:] = [os.getcwd(), *python_path(env, os.getcwd()), *site]
    sys.path_importer_cache.clear()
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))


def _std_streams(env: dict) -> None:
    """sys.stdin, sys.stdout and sys.stderr anew on fds 0, 1 and 2, as a new Python's
    (CPython's create_stdio): buffered (the fd's block size) but for PYTHONUNBUFFERED's stdout
    and stderr, stderr and a terminal line-buffered, no newline translation, named ``<stdin>``,
    ``<stdout>``, ``<stderr>``."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for name, fd, mode in (("stdin", 0, "rb"), ("stdout", 1, "wb"), ("stderr", 2, "wb")):
        old = getattr(sys, name)
        write_through = unbuffered and mode == "wb"
        buffer = open(fd, mode, buffering=0 if write_through else -1, closefd=False)
        (buffer if write_through else buffer.raw).name = f"<{name}>"
        stream = io.TextIOWrapper(
            buffer,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=not write_through and (name == "stderr" or os.isatty(fd)),
            write_through=write_through,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def argument_area() -> tuple[int, int]:
    """(address, bytes) of this process's argument strings, which /proc/<pid>/cmdline reads."""
    fields = stat_fields(os.getpid())  # arg_start and arg_end: /proc/<pid>/stat's fields 48 and 49
    start, end = int(fields[45]), int(fields[46])
    return start, end - start


def _set_command_line(argv: list[str]) -> None:
    """Write ``argv`` over this process's argument area (the rest zeros): /proc/<pid>/cmdline
    then reads it, its forks' too."""
    start, size = argument_area()
    ctypes.memmove(start, command_line(argv).ljust(size, b"\0"), size)


def command_line(argv: list[str]) -> bytes:
    """``argv`` as /proc/<pid>/cmdline holds it: each argument's bytes, each ended by a zero."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv)
