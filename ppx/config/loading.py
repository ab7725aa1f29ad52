"""Loading a config: defaults, then an experiment YAML (a name in experiments/ or a path),
then ``key=value`` overrides. Unknown keys and wrong types are rejected in one line; the
cross-field rules (`ppx.config.rules.check`) run last."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ppx.config.rules import check
from ppx.config.schema import Config
from ppx.errors import UserError
from ppx.paths import shipped


def experiments_dirs() -> list[Path]:
    """Where experiment names are looked up: ./experiments, then the shipped experiments."""
    dirs = [Path.cwd() / "experiments"]
    if shipped("experiments") not in dirs:
        dirs.append(shipped("experiments"))
    return dirs


def find_experiment(exp: str) -> Path:
    p = Path(exp)
    if p.suffix in (".yaml", ".yml") or os.sep in exp:
        if p.is_file():
            return p
        raise UserError(f"experiment file {exp} does not exist")
    for d in experiments_dirs():
        if (d / f"{exp}.yaml").is_file():
            return d / f"{exp}.yaml"
    known = sorted({q.stem for d in experiments_dirs() if d.is_dir() for q in d.glob("*.yaml")})
    raise UserError(f"unknown experiment {exp!r}; choose from {', '.join(known) or '(none found)'}")


def _one_line(e: OmegaConfBaseException) -> str:
    msg = (getattr(e, "msg", None) or str(e)).splitlines()[0]
    key = getattr(e, "full_key", None)
    return f"{key}: {msg}" if key else msg


def load(exp: str | None, overrides: list[str] = ()) -> Config:
    """Defaults <- experiment YAML (a name in experiments/ or a path) <- key=value overrides."""
    conf = OmegaConf.structured(Config)
    name = None
    try:
        if exp:
            path = find_experiment(exp)
            name = path.stem
            loaded = OmegaConf.load(path)
            if not isinstance(loaded, type(conf)) and loaded is not None:
                raise UserError(f"experiment file {path} must hold a mapping of keys")
            conf = OmegaConf.merge(conf, loaded or {})
        for item in overrides:
            if "=" not in item:
                raise UserError(f"override {item!r} must look like key=value")
        conf.merge_with_dotlist(list(overrides))
        cfg: Config = OmegaConf.to_object(conf)
    except OmegaConfBaseException as e:
        raise UserError(_one_line(e)) from None
    except Exception as e:  # YAML syntax errors and the like
        if isinstance(e, UserError):
            raise
        raise UserError(f"{exp}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if cfg.run.name is None:
        cfg.run.name = name or "default"
    check(cfg)
    return cfg


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml(path: str | Path) -> Config:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path)))
