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
    try:
        _check_free(cfg, own, path, key)
    except OSError as e:  # a name longer than the file system takes (255 bytes), a folder not to be read
        raise UserError(f"{key}: {e.strerror or e}" + _name_too_long(path)) from None


def _name_too_long(path: Path) -> str:
    """``; a name of N bytes, at most 255`` where one of ``path``'s names is longer than that."""
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    return f"; a name of {longest} bytes, at most 255" if longest > 255 else ""


def _check_free(cfg: Config, own: bool, path: Path, key: str) -> None:
    if own and path.exists():
        raise UserError(f"run directory {path} already exists; ppx never overwrites a run")
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
        path = Path(cfg.run.dir)
        not_in_a_run(f"run.dir={cfg.run.dir}", path)  # (a torchrun or srun of one's own claims here, unchecked before)
        made = [q for q in path.parents if not q.exists()]  # (removed again where the claim fails)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir()
        except (FileExistsError, NotADirectoryError):
            _remove_empty(made)
            check_free(cfg)  # what is in the way (it, or a file where a folder must go), said as before the run
            raise UserError(f"run.dir={path}: cannot create it (something else was there a moment ago)") from None
        except OSError as e:  # read-only, no permission, /proc: the key that named the place
            _remove_empty(made)
            raise UserError(f"run.dir={path}: cannot create it ({e.strerror or e}{_name_too_long(path)})") from None
        return path
    base = Path(cfg.run.root) / cfg.run.name
    not_in_a_run(f"run.root={cfg.run.root}", base)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        check_free(cfg)  # the file where a folder must go
        raise UserError(f"run.root={cfg.run.root}: cannot create {base} (a file was there a moment ago)") from None
    except OSError as e:
        raise UserError(f"run.root={cfg.run.root}: cannot create {base} ({e.strerror or e})") from None
    return new_folder(base, time.strftime("%Y%m%d-%H%M%S"))


def _remove_empty(folders: list[Path]) -> None:
    """The folders a failed claim made on its way (deepest first), where they are still empty."""
    for q in folders:
        try:
            q.rmdir()
        except OSError:
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
