"""Loading a config: defaults, then a model preset's keys (``model.preset``, or the shapes a
loaded kind reads from its source: `ppx.models.shape_defaults`), then an
experiment YAML (a name in experiments/ or a path), then ``key=value`` overrides. Unknown keys and wrong types are rejected in one line; the
cross-field rules (`ppx.config.rules.check`) run last."""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from omegaconf.nodes import StringNode

from ppx import models
from ppx.config.rules import check
from ppx.config.schema import Config
from ppx.errors import UserError, first_line, said
from ppx.models.llama_shapes import preset
from ppx.paths import shipped
from ppx.schedules.registry import is_csv


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
        if p.is_dir():
            raise UserError(f"experiment file {exp} is a folder; give an experiment's YAML file")
        if p.exists():  # (/dev/null said "does not exist"; /dev/zero would be read without end)
            raise UserError(f"experiment file {exp} is not a file (a device, a pipe); give an experiment's YAML file")
        raise UserError(f"experiment file {exp} does not exist{_did_you_mean(exp)}")
    for d in experiments_dirs():
        if (d / f"{exp}.yaml").is_file():
            return d / f"{exp}.yaml"
    known = sorted({q.stem for d in experiments_dirs() if d.is_dir() for q in d.glob("*.yaml")})
    raise UserError(f"unknown experiment {exp!r}; choose from {', '.join(known) or '(none found)'}")


def _did_you_mean(exp: str) -> str:
    """The hint for an experiment file that does not exist: ``<exp>.yaml`` where ``exp`` has
    no YAML suffix and that file is there, else the experiment of its name where one is known
    (a bare file name's, or any path's without a suffix)."""
    p, bare = Path(exp), exp.rstrip(os.sep) or exp  # (experiments/x/: a shell's completion)
    yaml_file = p.suffix not in (".yaml", ".yml")
    if yaml_file and Path(f"{bare}.yaml").is_file():
        return f" (did you mean {bare}.yaml?)"
    name = p.name + (".yaml" if yaml_file else "")
    if (yaml_file or os.sep not in exp) and any((d / name).is_file() for d in experiments_dirs()):
        return f" (did you mean the experiment {Path(name).stem}?)"
    return ""


def _read_yaml(path: Path):
    """An experiment file's keys (None: empty); one line where it holds no mapping of keys (a
    bare value, a list) or is no text."""
    try:
        loaded = OmegaConf.load(path)
    except UnicodeDecodeError:
        raise UserError(f"experiment file {path} is not a text file (YAML)") from None
    except OSError as e:
        if "Invalid loaded object type" not in str(e):
            raise
        loaded = ()  # (OmegaConf refuses a bare number or string: no mapping of keys)
    if not isinstance(loaded, DictConfig) and loaded is not None:
        raise UserError(f"experiment file {path} must hold a mapping of keys (key: value lines)")
    return loaded


HEAD, TAIL = 45, 32  # characters kept of a longer key or quoted text in an error, from its start and its end


def _one_line(e: OmegaConfBaseException) -> str:
    msg = first_line(getattr(e, "msg", None) or str(e))
    key = getattr(e, "full_key", None)
    if key and f"'{key}'" in msg and _cut(key) != key:
        key = None  # (the message names it: once, cut; /etc/passwd's every line was the key, twice)
    msg = re.sub(r"'([^']*)'", lambda q: _cut(q.group(1), "'"), msg)
    return f"{_cut(key)}: {msg}" if key else msg


def _cut(text: str, quote: str = "") -> str:
    """``text`` (in ``quote``s), or its start and its end (a typo is mostly at a key's end) and,
    outside the quotes, how many characters it has: a file of no YAML keys reads as one key
    of all its text."""
    if len(text) <= HEAD + TAIL + 3:
        return f"{quote}{text}{quote}"
    return f"{quote}{text[:HEAD]}...{text[-TAIL:]}{quote} ({len(text)} characters)"


@functools.cache
def _schema() -> DictConfig:
    """The schema with its defaults, built once and never changed: `OmegaConf.structured`
    walks every dataclass (about 17 ms a call); `OmegaConf.merge` copies it (3 ms)."""
    return OmegaConf.structured(Config)


def _layers(preset: dict | None, loaded, overrides: list[str]):
    """Defaults <- the preset's model keys <- the experiment YAML <- the overrides."""
    conf = _schema()  # (each merge below returns a new config: the schema stays as it is)
    if preset:
        conf = OmegaConf.merge(conf, {"model": preset})
    conf = OmegaConf.merge(conf, loaded or {})
    merge_overrides(conf, overrides)
    return conf


def merge_overrides(conf: DictConfig, overrides) -> None:
    """``key=value`` overrides into ``conf``, in order, their values read as YAML (OmegaConf's
    dotlist), except that a key of text, or a list of text, keeps what was typed: ``run.name=007``,
    ``logging.wandb.project=no``, ``model.units=[007,yes]`` are the text, not 7, False and
    [7, True] (``null`` is still null, and ``${...}`` an interpolation)."""
    for item in overrides:
        key, _, text = item.partition("=")
        key = key.strip()
        node = _node(conf, key)
        typed = "${" not in text  # (${...}: OmegaConf's)
        if typed and isinstance(node, StringNode):
            if isinstance(OmegaConf.select(OmegaConf.from_dotlist([item]), key), (bool, int, float)):
                OmegaConf.update(conf, key, text.strip(), merge=True)
                continue
        elif typed and _text_list(node) and text.strip().startswith("["):
            try:
                words = yaml.load(text, Loader=yaml.BaseLoader)  # (every scalar the text typed)
            except yaml.YAMLError:  # (OmegaConf's reading below says what is wrong)
                words = None
            if isinstance(words, list) and all(isinstance(w, str) for w in words):
                OmegaConf.update(conf, key, words, merge=False)
                continue
        try:
            conf.merge_with_dotlist([item])
        except OmegaConfBaseException:
            value = text.strip()
            if typed and isinstance(node, ListConfig) and value and not value.startswith("["):
                raise UserError(f"{key}={value}: a list goes in brackets: {key}=[{value}]") from None
            raise


def _text_list(node) -> bool:
    """Whether ``node`` is a list of text (``model.units``, ``run.paired``)."""
    return isinstance(node, ListConfig) and getattr(node._metadata, "element_type", None) is str


def _node(conf: DictConfig, key: str):
    """The node at dotted ``key`` of ``conf``, or None where there is none."""
    node = conf
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return None
        node = node._get_node(part)
    return node


def _with_preset(conf, loaded, overrides: list[str]):
    """``conf`` rebuilt with ``model.preset``'s keys inserted under the experiment, so keys
    given beside the preset win; a preset is llama's, so another model.kind given is an error."""
    name = conf.model.preset
    keys = preset(name)
    given = (loaded is not None and OmegaConf.select(loaded, "model.kind") is not None) or any(
        o.split("=", 1)[0] == "model.kind" for o in overrides
    )
    if given and conf.model.kind != keys["kind"]:
        raise UserError(
            f"model.preset={name} is a {keys['kind']} shape but model.kind={conf.model.kind}; drop model.kind or set it to llama"
        )
    return _layers(keys, loaded, overrides)


def load(exp: str | None, overrides: list[str] = ()) -> Config:
    """Defaults <- model.preset's keys <- experiment YAML (a name in experiments/ or a path) <-
    key=value overrides. The preset is read from a first merge of the others."""
    name, loaded, path = None, None, None
    try:
        if exp is not None and not exp.strip():  # (None: no experiment, the defaults, as tests load them)
            raise UserError("the experiment is empty: give its name (from experiments/) or the path of its YAML file")
        if exp:
            path = find_experiment(exp)
            name = path.stem
            loaded = _read_yaml(path)
        for item in overrides:
            if "=" not in item or not item.partition("=")[0].strip():
                raise UserError(f"override {item!r} must look like key=value")
        overrides = [_one_entry(item) for item in overrides]
        conf = _layers(None, loaded, overrides)
        if conf.model.preset is not None:
            conf = _with_preset(conf, loaded, overrides)
        elif conf.model.kind in models.LOADED:  # the shapes of what it loads, under the experiment's keys
            conf = _layers(models.shape_defaults(conf.model), loaded, overrides)
        cfg: Config = OmegaConf.to_object(conf)
    except OmegaConfBaseException as e:
        where = f"{path}: " if _from_file(e, loaded, overrides) else ""  # (a key of the file's: which file)
        section = None if getattr(e, "full_key", None) else _not_a_section(loaded)
        if section is not None:  # (OmegaConf's merge names neither: "Merge error: int is not a subclass of ...")
            where = f"{path}: {section}: "
        raise UserError(where + _one_line(e)) from None
    except Exception as e:  # YAML syntax errors and the like
        if isinstance(e, UserError):
            raise
        raise UserError(_yaml_error(e, exp, overrides)) from None
    if cfg.run.name is None:
        cfg.run.name = name or "default"
    if isinstance(cfg.train.recompute, list) and len(cfg.train.recompute) == 1:  # [full]: one mode, every stage's
        cfg.train.recompute = cfg.train.recompute[0]
    for key in ("root", "dir"):  # ~ typed as the home folder (no shell expands it after "run.root=")
        value = getattr(cfg.run, key)
        if isinstance(value, str) and value.startswith("~"):
            setattr(cfg.run, key, os.path.expanduser(value))
    _checked(cfg, path, loaded)
    if cfg.run.paired:  # each entry a config of its own, checked now, before any work
        from ppx.config.paired import variants

        variants(cfg)
    if cfg.runtime.cpu_fallback:  # keys and types checked on every machine, not only where it applies
        try:
            merge_overrides(copy.deepcopy(_schema()), cfg.runtime.cpu_fallback)
        except OmegaConfBaseException as e:
            raise UserError(f"runtime.cpu_fallback: {_one_line(e)}") from None
    return cfg


def first_merge(exp: str | None, overrides: list[str] = ()) -> DictConfig | None:
    """The defaults, the experiment and the overrides merged as `load` first merges them (no
    model.preset's keys, nothing imported, nothing checked: 10-50 ms); None where that merge
    fails (`load` says why)."""
    try:
        loaded = _read_yaml(find_experiment(exp)) if exp else None
        return _layers(None, loaded, [_one_entry(o) for o in overrides])
    except Exception:
        return None


def _checked(cfg: Config, path: Path | None, loaded) -> None:
    """`check`, its line for a schedule CSV that cannot be read from a run's own config.yaml
    (``path``: run again from another folder, the CSV's path relative to the first) naming the
    copy that run kept (`ppx.launch.claim.write_config`)."""
    try:
        check(cfg)
    except UserError as e:
        own = loaded is not None and OmegaConf.select(loaded, "pipeline.schedule") == cfg.pipeline.schedule
        kept = _kept_copy(cfg.pipeline.schedule, path) if own else None  # (not a CSV an override named)
        if kept is None or not str(e).startswith("cannot read schedule CSV"):
            raise
        raise UserError(f"{e} (the run of {path} kept a copy: pipeline.schedule={kept})") from None


def _kept_copy(schedule: str, path: Path | None) -> Path | None:
    """The copy of CSV ``schedule`` in the run folder of config file ``path``, where there is one."""
    if path is None or path.name != "config.yaml" or not is_csv(schedule):
        return None
    kept = path.parent / "schedules" / Path(schedule).name
    return kept if kept.is_file() else None


def _not_a_section(loaded) -> str | None:
    """The first key of the experiment file ``loaded`` that holds a value where the schema has
    a section of keys (``pipeline: 3``), or None."""
    if loaded is None:
        return None
    schema = _schema()
    for key, value in OmegaConf.to_container(loaded, resolve=False).items():
        if isinstance(schema.get(key), DictConfig) and not isinstance(value, dict) and value is not None:
            return key
    return None


def _from_file(e: OmegaConfBaseException, loaded, overrides: list[str]) -> bool:
    """Whether the key ``e`` is about is the experiment file's, not an override's (one that sets
    it, or a key above it: ``pipeline={stages: two}``)."""
    key = getattr(e, "full_key", None)
    if not key or loaded is None:
        return False
    for o in overrides:
        given = o.partition("=")[0].strip()
        if key == given or key.startswith((given + ".", given + "[")):
            return False
    return _holds(OmegaConf.to_container(loaded, resolve=False), key)  # (a null or an interpolation: the file's)


def _holds(node, key: str) -> bool:
    """Whether ``node`` holds ``key`` (OmegaConf's ``a.b[0].c``), whose parts may hold dots and
    brackets of their own: /etc/os-release's text, one key of URLs, was not named the file's."""
    if not key:
        return True
    if isinstance(node, list):
        at = re.match(r"\[(\d+)\]\.?", key)
        return bool(at) and int(at[1]) < len(node) and _holds(node[int(at[1])], key[at.end() :])
    for part, value in node.items() if isinstance(node, dict) else ():
        rest = key.removeprefix(str(part))
        if rest != key and rest[:1] in ("", ".", "[") and _holds(value, rest.removeprefix(".")):
            return True
    return False


def _one_entry(item: str) -> str:
    """``run.paired=<overrides>`` without brackets as the list of that one entry (a list key
    otherwise refuses a string, in OmegaConf's words); every other override as it is."""
    key, _, value = item.partition("=")
    value = value.strip()
    if key.strip() != "run.paired" or not value or value.startswith("[") or '"' in value or value == "null":
        return item
    return f'run.paired=["{value}"]'


def _yaml_error(e: Exception, exp: str | None, overrides: list[str]) -> str:
    """A YAML error in one line: in the experiment file, where (line and column, 1-based) and
    what, as the parser says; in an override's value (the parser read a string), which one."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or not problem:
        return f"{exp}: {said(e)}"
    what = problem + (f" ({e.context})" if getattr(e, "context", None) else "")
    if not str(mark.name).startswith("<"):  # the file it read
        return f"{mark.name}: line {mark.line + 1}, column {mark.column + 1}: {what}"
    for item in overrides:
        try:
            yaml.safe_load(item.partition("=")[2])
        except yaml.YAMLError:
            hint = ""
            unquoted = re.sub(r'"[^"]*"|\'[^\']*\'', "", item)
            if item.startswith("run.paired=") and unquoted.count("[") > 1:  # an entry's own list value, unquoted
                hint = (
                    " (quote an entry whose value holds brackets: 'run.paired=[\"pipeline.layers_per_stage=[2,2]\"]')"
                )
            return f"override {item!r}: its value is not YAML: {what}{hint}"
    return f"an override's value is not YAML: {what}"


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml(path: str | Path) -> Config:
    """A whole config as `to_yaml` wrote it (a run's config.yaml). One written before
    pipeline.balance existed ran its units split evenly, and reads back so."""
    loaded = OmegaConf.load(path)
    if isinstance(loaded, DictConfig) and isinstance(loaded.get("pipeline"), DictConfig):
        if "balance" not in loaded.pipeline:
            loaded.pipeline.balance = "units"
    return OmegaConf.to_object(OmegaConf.merge(_schema(), loaded))


# The sinks a run read only through its files (summary.json, metrics.jsonl) goes without: W&B
# (about 0.3 s a short run, its writer beside the drawing; 5 MB) and the pictures and
# report.html (about 2 s). A calibration, gpu-check's runs, make bench's and the tests' (dotted
# key -> value).
SUMMARY_ONLY = {"logging.wandb.mode": "disabled", "logging.report": False}


def as_overrides(keys: dict) -> list[str]:
    """``key=value`` overrides that read back as ``keys``' values (booleans lower case, lists
    in brackets, None as null)."""
    return [f"{k}={_text(v)}" for k, v in keys.items()]


def _text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return "null" if value is None else str(value)
