"""Run directories are claimed once, atomically, and never overwritten, and given what the
run was asked to run (`write_config`)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from ppx.config import Config
from ppx.errors import UserError
from ppx.report.run_dir import run_holding


def check_free(cfg: Config, one_run: bool = True) -> None:
    """Refuse, before anything else is said or done, a ``run.dir`` that exists or lies under a
    file, and a ``run.root`` that is a file or lies under one (`claim` still claims atomically).
    ``one_run`` False (a sweep, whose runs go under run.root whatever run.dir says): run.root's only."""
    own = bool(cfg.run.dir) and one_run
    path = Path(cfg.run.dir) if own else Path(cfg.run.root) / cfg.run.name
    key = f"run.dir={cfg.run.dir}" if own else f"run.root={cfg.run.root}"
    refuse_long_names(key, path)
    try:
        _check_free(cfg, own, path, key)
    except OSError as e:  # a folder not to be read, a path past the system's length
        raise UserError(f"{key}: {e.strerror or e}") from None


def refuse_long_names(key: str, path: Path) -> None:
    """Refuse a name in ``path`` longer than its file system takes (255 bytes on most): said
    with the key before any folder is made (Python's own checks may raise it, or not)."""
    nearest = next((q for q in path.absolute().parents if os.path.isdir(q)), Path("/"))
    try:
        most = os.pathconf(nearest, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > most:
        raise UserError(f"{key}: File name too long; a name of {longest} bytes, at most {most}")


def _check_free(cfg: Config, own: bool, path: Path, key: str) -> None:
    if own and path.is_file():
        raise UserError(f"{key}: {path} is a file, not a run directory; give a new folder's path")
    if own and path.exists():
        raise UserError(
            f"run directory {path} already exists; ppx never overwrites a run: give another run.dir, or "
            "run.dir=null for a new run under run.root"
        )
    if own and path.is_symlink():  # (a link to nothing: exists() says no, mkdir says it is there)
        raise UserError(
            f"run.dir={cfg.run.dir} is a link to {path.readlink()}, which does not exist; give another run.dir"
        )
    above = next((q for q in [path, *path.parents] if q.exists()), None)
    if above is not None and not above.is_dir():
        raise UserError(f"{key}: {above} is a file, not a folder")
    not_in_a_run(key, path)


def not_in_a_run(key: str, path: Path) -> None:
    """Refuse a run directory ``path`` (set by ``key``) inside another run's."""
    run = run_holding(path)
    if run is not None:
        raise UserError(f"{key}: the run would go inside the run {run}; ppx never writes into a run")


def claim(cfg: Config) -> Path:
    """Create the run directory atomically: exactly ``run.dir`` if given (it must not exist),
    else ``<run.root>/<run.name>/<YYYYmmdd-HHMMSS>[-N]``."""
    if cfg.run.dir:
        path, key = Path(cfg.run.dir), f"run.dir={cfg.run.dir}"
        refuse_long_names(key, path)  # (a torchrun or srun of one's own claims here, unchecked before)
        not_in_a_run(key, path)
        made = _missing(path.parents)  # (removed again where the claim fails)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir()
        except (FileExistsError, NotADirectoryError):
            _remove_empty(made)
            check_free(cfg)  # what is in the way (it, or a file where a folder must go), said as before the run
            raise UserError(f"{key}: cannot create it (something else was there a moment ago)") from None
        except OSError as e:  # read-only, no permission, /proc, a full disk: the key that named the place
            _remove_empty(made)
            raise UserError(f"{key}: cannot create it ({e.strerror or e})") from None
        return path
    base, key = Path(cfg.run.root) / cfg.run.name, f"run.root={cfg.run.root}"
    refuse_long_names(key, base)
    not_in_a_run(key, base)
    made = _missing([base, *base.parents])
    try:
        base.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        _remove_empty(made)
        check_free(cfg)  # the file where a folder must go
        raise UserError(f"{key}: cannot create {base} (a file was there a moment ago)") from None
    except OSError as e:
        _remove_empty(made)
        raise UserError(f"{key}: cannot create {base} ({e.strerror or e})") from None
    return new_folder(base, time.strftime("%Y%m%d-%H%M%S"))


def _missing(folders) -> list[Path]:
    """Those of ``folders`` (deepest first) that do not exist yet."""
    return [q for q in folders if not os.path.lexists(q)]


def _remove_empty(folders: list[Path]) -> None:
    """The folders a failed claim made on its way (deepest first, those it may have made),
    each where it is there and still empty: one another run has put a folder in stays, and
    so do those above it."""
    for q in folders:
        try:
            q.rmdir()
        except FileNotFoundError:  # (not made: the claim failed before it)
            continue
        except OSError:  # (not empty: another run's now; or not to be removed)
            return


def new_folder(base: Path, name: str) -> Path:
    """A new folder ``base/<name>``, or ``<name>-1``, ``-2``, ... where that exists: made here,
    so two runs (or sweeps) begun in the same second get one each."""
    for n in range(1000):
        path = base / (name if n == 0 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UserError(f"could not create a new folder {name} under {base}")


def write_config(path: Path, cfg: Config, entry_schedules: list[str] | None = None) -> None:
    """The run's ``config.yaml`` (the resolved config) and, under ``schedules/``, a copy of each
    schedule CSV it reads (its own, then its run.paired entries' (``entry_schedules``, or read
    from their configs), each file once), as they are now: the order a run ran stays with it
    when the file is edited, moved or deleted. Where they cannot be written (a full disk), the
    run directory `claim` just made is removed again and that is one line."""
    try:
        _write_config(path, cfg, entry_schedules)
    except OSError as e:
        shutil.rmtree(path, ignore_errors=True)  # (made by `claim` a moment ago: nothing else is in it)
        outside = e.filename is not None and Path(path).resolve() not in Path(e.filename).resolve().parents
        what = f"cannot read {e.filename}" if outside else f"cannot write the run directory {path}"
        raise UserError(f"{what}: {e.strerror or e}") from None


def _write_config(path: Path, cfg: Config, entry_schedules: list[str] | None) -> None:
    from ppx import config
    from ppx.config.paired import entry_config
    from ppx.schedules import is_csv

    (path / "config.yaml").write_text(config.to_yaml(cfg))
    if entry_schedules is None:
        entry_schedules = [entry_config(cfg, e).pipeline.schedule for e in cfg.run.paired]
    names = [cfg.pipeline.schedule, *entry_schedules]
    copied: dict[Path, Path] = {}  # the CSV's file -> its copy
    for name in names:
        if not is_csv(name) or Path(name).resolve() in copied:
            continue
        out = path / "schedules" / Path(name).name
        k = 1
        while out in copied.values():  # two CSVs of one name from two folders: both kept
            out, k = out.with_name(f"{Path(name).stem}-{k}.csv"), k + 1
        out.parent.mkdir(exist_ok=True)
        shutil.copyfile(name, out)
        copied[Path(name).resolve()] = out
