"""Whether the agent server's fork (`ppx.launch.agent_server`) would be the process a request
asks for, from the first line of ppx's code on, and why not: `refused`. The fork inherits what
the server imported and what those imports read, so a request is refused (a new process then)
where a new Python would import or read otherwise: another module found first on its path (a
test's stand-in for a package, another checkout's ppx), a variable read as the server imported
(thread counts, Python's, the locale's, matplotlib's, transformers' and the GPUs'), or anything
the server's imports printed (a warning a new process would print in its own output)."""

from __future__ import annotations

import importlib.machinery
import os
import sys
from dataclasses import dataclass

import ppx
from ppx.launch.served_agent import AGENT_MODULE, CLI_MODULE
from ppx.models.hf_config import IMPORT_SETTINGS

# what Python, the locale, torch, matplotlib and transformers read from the environment as they
# are imported (a PYTHON* variable besides those a running ppx reads: `RUN_TIME`)
IMPORT_TIME = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "LOGLEVEL",
    "TORCH_LOGS",
    "TORCH_TRACE",
    "TORCH_COMPILE_DEBUG",
    "LANG",
    "LANGUAGE",
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "CUDA_VISIBLE_DEVICES",
)
IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "TORCHDYNAMO_",
    "TORCHINDUCTOR_",
    "KMP_",
    "GOMP_",
    "LC_",
    "MPL",
    "HF_",
    "TRANSFORMERS_",
    "HUGGINGFACE_",
)
RUN_TIME = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONBREAKPOINT")


@dataclass(frozen=True)
class Server:
    """What a server's forks inherit: its environment as it started (``started``), what its
    imports set there (``imported``: a new process's imports set it too), its ``sys.path``
    after the working folder, less its own PYTHONPATH (``site``), what it runs (``module``) and
    what its imports printed (``printed``)."""

    started: dict
    imported: dict
    site: list
    module: str
    printed: str = ""


def refused(request: dict, fds: int, server: Server, pad_bytes: int, command_bytes: int) -> str | None:
    """Why ``server`` will not fork the process ``request`` asks for, or None (``fds``: how many
    it passed; ``pad_bytes``: the server's argument area, ``command_bytes``: the request's)."""
    argv, env = request.get("argv") or [], request.get("env") or {}
    if argv[:3] != [sys.executable, "-m", server.module]:
        return f"not {sys.executable} -m {server.module}"
    if server.module == AGENT_MODULE and request.get("ppx") != ppx.__file__:
        return f"ppx is {request.get('ppx')} there, {ppx.__file__} here"
    if server.module == CLI_MODULE and CLI_MODULE in sys.modules:  # (runpy would warn: imported twice)
        return f"{CLI_MODULE} was imported by the server"
    if server.printed:
        return f"the server's imports printed {server.printed!r}"
    if fds != 3:
        return "stdin, stdout and stderr not passed"
    if command_bytes > pad_bytes:
        return "the command line is longer than the server's PAD"
    started, imported = server.started, server.imported
    names = {k for k in (*env, *started) if _read_at_import(k)}
    set_by_imports = {k for k in imported if env.get(k) == imported[k]}  # (handed on by a process that imported torch)
    differ = sorted(k for k in names - set_by_imports if _read(env, k) != _read(started, k))
    if differ:
        return f"{', '.join(differ)} not as the server's imports read"
    if "MPLCONFIGDIR" in imported:  # (its atexit removes it: a fork's end would take the server's away)
        return "matplotlib made a temporary MPLCONFIGDIR in the server"
    cwd = request.get("cwd") or "/"
    own = python_path(env, cwd)
    try:
        return _shadowed([cwd, *own, *server.site], own)
    finally:
        for folder in (cwd, *own):  # (a folder made later, or changed, is looked at anew)
            sys.path_importer_cache.pop(folder, None)


def _read(env: dict, name: str) -> str | None:
    """The value of ``name`` an import reads in ``env``: transformers' as ppx imports it (where
    unset, ppx's offline and quiet defaults: `ppx.models.hf_config.IMPORT_SETTINGS`)."""
    return env.get(name, IMPORT_SETTINGS.get(name))


def _read_at_import(name: str) -> bool:
    return name in IMPORT_TIME or (name.startswith(IMPORT_TIME_PREFIXES) and name not in RUN_TIME)


def python_path(env: dict, cwd: str) -> list[str]:
    """PYTHONPATH's folders as `site` puts them on ``sys.path`` of a Python started in ``cwd``: absolute."""
    return [os.path.abspath(os.path.join(cwd, p)) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _shadowed(path: list[str], own: list[str]) -> str | None:
    """Why a module this server imported would not be that one in a new Python whose
    ``sys.path`` is ``path`` (``own``: its PYTHONPATH's folders), or None: it finds another
    there first, or none; or its PYTHONPATH holds a sitecustomize or usercustomize, which it
    would run as it starts. (A namespace package, and a package a library only looked for as
    the server imported it, are not compared.)"""
    for name in ("sitecustomize", "usercustomize"):
        found = importlib.machinery.PathFinder.find_spec(name, own) if own else None
        if found is not None and found.origin != getattr(sys.modules.get(name), "__file__", None):
            return f"{name} is {found.origin} there"  # (the server's own ran as it started)
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
