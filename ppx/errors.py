"""Error types: a `UserError` is bad input, reported as one line before any work starts; an
exception in one line (`said`), with where the user's own code raised it (`said_where`)."""

import functools
import os
import site
import sysconfig


class UserError(Exception):
    """Bad input from the user (config, command line, experiment file).

    The CLI prints it as a single ``ppx: error: ...`` line and exits with status 2.
    """


class ScheduleError(UserError):
    """An action list that cannot run (wrong order, unmatched send/recv, deadlock)."""


def first_line(e: BaseException | str) -> str:
    """``e``'s message (or a text) in one line: its first non-blank line, with the next one
    where the first only announces it (ends in ':'); "" for an exception raised without a
    message."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def said(e: BaseException) -> str:
    """``Type: its first line`` (`first_line`), or just ``Type`` where it said nothing, for
    one-line errors."""
    line = first_line(e)
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def os_words(e: OSError) -> str:
    """An OSError as the OS says it, with the file it names: ``File too large: <path>``."""
    return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")


def said_where(e: BaseException) -> str:
    """`said`, with where the user's own code raised it (`raised_at`): ``ValueError: my model
    broke (at mypkg/model.py:31)``."""
    at = raised_at(e)
    return f"{said(e)} (at {at})" if at else said(e)


def raised_at(e: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``e``'s traceback in the user's own code (a
    model's module, a batch or loss function): not Python's, an installed package's (torch,
    transformers) or ppx's; its path from the working folder where it lies under it. None
    where no such frame raised it."""
    found, tb = None, e.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if _users(path):
            found = (path, tb.tb_lineno)
        tb = tb.tb_next
    if found is None:
        return None
    path, line = found
    try:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(os.getcwd()))
    except (ValueError, OSError):  # (another drive; a working folder removed)
        rel = os.pardir
    return f"{path if rel.startswith(os.pardir) else rel}:{line}"


def _users(path: str) -> bool:
    """Whether source file ``path`` is the user's own code (`raised_at`)."""
    if not path or path.startswith("<"):  # (<frozen ...>, <string>)
        return False
    path = os.path.realpath(path)
    return not any(path.startswith(p + os.sep) for p in _not_users())


@functools.cache
def _not_users() -> tuple[str, ...]:
    """Folders whose code is not the user's: Python's library, installed packages, ppx."""
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    folders.update(getattr(site, "getsitepackages", list)())
    if site.ENABLE_USER_SITE and site.USER_SITE:
        folders.add(site.USER_SITE)
    folders.add(os.path.dirname(os.path.abspath(__file__)))  # (ppx itself, installed or a checkout)
    return tuple(os.path.realpath(f) for f in folders)
