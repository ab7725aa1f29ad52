"""Files written whole or not at all (`write_whole`, `write_json`, `save_figure`): each goes
beside its path and is renamed over it, so a write that fails (a full disk, a file-size limit)
leaves the file before it as it was and no part of the new one, which a tool reading it back
would take for the whole (a run's summary.json or timeline.json, a plan's best.csv), and says
which file it was. And `stdout_to_null`: a stream whose reader went away sent to /dev/null."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path


def write_whole(path, text: str) -> None:
    """``text`` to ``path`` (UTF-8) whole or not at all."""
    _whole(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path, data, indent: int = 2) -> None:
    """``data`` as JSON to ``path``, whole or not at all."""
    write_whole(path, json.dumps(data, indent=indent) + "\n")


def save_figure(fig, path, **savefig) -> None:
    """A matplotlib figure written to ``path`` (its format from the suffix) whole or not at
    all, then closed (matplotlib's own failed write says only "File too large")."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        _whole(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".").lower(), **savefig))
    finally:
        plt.close(fig)


def _whole(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` beside ``path``'s file (a link's target: the link stays), then renamed
    over it; on any failure (a stop signal too) the part is removed, and an OSError names
    ``path``, not the part nor no file at all. What is there and not a file (/dev/stdout, a
    pipe, a device) is written in place: a rename would put a file where it was."""
    in_place = path.exists() and not path.is_file()
    real = path if in_place else Path(os.path.realpath(path))
    tmp = real if in_place else real.with_name(real.name + ".tmp")
    try:
        write(tmp)
        if not in_place:
            os.replace(tmp, real)
    except BaseException as e:
        if not in_place:
            with contextlib.suppress(OSError):  # (the write's error is the one to say)
                tmp.unlink()
        if isinstance(e, OSError) and e.errno is not None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        if isinstance(e, OSError):  # (no errno: a library's own, "encoder error -2")
            raise OSError(f"{path}: {e}") from None
        raise


def stdout_to_null(stream=None) -> None:
    """Point ``stream``'s file descriptor (sys.stdout's by default) at /dev/null: its reader went
    away, and what its buffer still holds goes there too, at exit as well."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, (stream or sys.stdout).fileno())
    os.close(null)
