"""Short names for runs side by side: each run is labelled by the config values that vary
between the runs (``interleaved_1f1b v=2``, ``m=16``, ``hidden=256``), so a picture or a
table names what it compares instead of numbering its runs.

`run_labels` is pure (flattened configs in, labels out); `flat_config` reads one run's
flattened config, with schedule, p, v, m and model from its summary (what ran)."""

from __future__ import annotations

from typing import Any

SCHEDULE, STAGES, VIRTUAL, MICRO = (
    "pipeline.schedule",
    "pipeline.stages",
    "pipeline.virtual_stages",
    "pipeline.microbatches",
)
FIRST = (SCHEDULE, STAGES, VIRTUAL, MICRO)  # then model.*, then the rest, in config order
SHORT = {STAGES: "p", VIRTUAL: "v", MICRO: "m", "model.kind": "model"}
# what names or records a run rather than what it runs: never a difference of its own
IGNORED = ("run.", "logging.", "profile.", "instrument.")
UNREAD = "run.config_unread"  # flat_config's mark where a run's config.yaml could not be read
# a model kind's own keys: no part of a run of another kind (an mlp run has model.fwd_ms in its
# config, at its default, but nothing reads it)
KIND_KEYS = {
    "synthetic": ("model.fwd_ms", "model.bwd_ms", "model.wgrad_ms", "model.cost_per"),
    "hf": ("model.hf_config", "model.hf_overrides"),
    "module": tuple(f"model.{k}" for k in ("module", "args", "units", "split_points", "data", "batch_fn", "loss_fn")),
}


def _reads(config: dict[str, Any], key: str) -> bool:
    """Whether a run of ``config`` (flattened) reads ``key``: any but another model kind's own."""
    kind = config.get("model.kind")
    return not any(key in keys for k, keys in KIND_KEYS.items() if k != kind)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{"a.b": value}``, in the tree's order (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def flat_config(run) -> dict[str, Any]:
    """One `RunDir`'s config flattened (config.yaml when it has one), with the resolved
    schedule, p, v, m and model kind taken from its summary."""
    from dataclasses import asdict

    flat: dict[str, Any] = {UNREAD: True}  # (run.*: never a label's part)
    if (run.path / "config.yaml").exists():
        try:
            flat = flatten(asdict(run.config))
        except Exception:  # a config.yaml this ppx cannot read (an older schema): the summary's values
            pass
    s = run.summary
    # p is the ranks (pipeline.stages), not the summary's stages: an interleaved run has v per rank
    flat.update({SCHEDULE: s.schedule, STAGES: s.world_size, VIRTUAL: s.virtual, MICRO: s.microbatches})
    if s.model:
        flat["model.kind"] = s.model
    return flat


def timing_key(config: dict[str, Any]) -> str | None:
    """What decides a run's timings in its flattened config (`flat_config`): all of it but its
    folder and its logging. Two runs of one key ran the same thing. None where the run's
    config.yaml was not read (its summary's few values cannot tell two configs apart)."""
    if config.get(UNREAD):
        return None
    return repr(sorted((k, _value(v)) for k, v in config.items() if not k.startswith(("run.", "logging."))))


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def _order(keys: list[str]) -> list[str]:
    first = [k for k in FIRST if k in keys]
    model = [k for k in keys if k.startswith("model.") and k not in first]
    return first + model + [k for k in keys if k not in first and k not in model]


def _part(key: str, value: Any, names: dict[str, str]) -> str:
    return _value(value) if key == SCHEDULE else f"{names[key]}={_value(value)}"


def _names(keys: list[str]) -> dict[str, str]:
    """Each key's short name: p, v, m, model, else its last part (the whole key where two
    keys would share a last part)."""
    last = [SHORT.get(k, k.rsplit(".", 1)[-1]) for k in keys]
    return {k: n if last.count(n) == 1 else k for k, n in zip(keys, last)}


def shared_label(configs: list[dict[str, Any]]) -> str:
    """What all the runs share of schedule, p, v, m and model (``1f1b p=2 m=4 model=mlp``),
    for a picture's title; v only when above 1."""
    keys = [*FIRST, "model.kind"]
    same = [k for k in keys if k in configs[0] and all(c.get(k) == configs[0][k] for c in configs)]
    names = _names(keys)
    return " ".join(_part(k, configs[0][k], names) for k in same if k != VIRTUAL or configs[0][k] > 1)


def run_labels(configs: list[dict[str, Any]], folders: list[str]) -> list[str]:
    """One short, unique label per run, made of the values that vary between the runs, in the
    order schedule, p, v, m, model settings, the rest. ``configs`` are the runs' flattened
    configs (`flat_config`), ``folders`` their folder names, the fallback where nothing else
    tells two runs apart. One run alone is its schedule, p, (v,) m."""
    if len(configs) == 1:
        c = configs[0]
        keys = [k for k in (SCHEDULE, STAGES, VIRTUAL, MICRO) if k in c and (k != VIRTUAL or c[k] > 1)]
        return [" ".join(_part(k, c[k], SHORT) for k in keys)]
    everywhere = list(dict.fromkeys(k for c in configs for k in c))
    varying = [
        k
        for k in everywhere
        if not k.startswith(IGNORED) and len({_value(c.get(k)) for c in configs}) > 1 and k != VIRTUAL
    ]
    # v counts as varying where one schedule runs with two v's; otherwise it follows its
    # schedule, shown beside it where above 1
    by_schedule: dict[Any, set] = {}
    for c in configs:
        by_schedule.setdefault(c.get(SCHEDULE), set()).add(c.get(VIRTUAL, 1))
    v_varies = any(len(vs) > 1 for vs in by_schedule.values())
    keys = _order(varying + ([VIRTUAL] if v_varies or SCHEDULE in varying else []))
    names = _names(keys)
    labels = []
    for c in configs:
        vs = by_schedule[c.get(SCHEDULE)]
        shown = [k for k in keys if k in c and _reads(c, k) and (k != VIRTUAL or len(vs) > 1 or (c[k] or 1) > 1)]
        # a key this run leaves unset (None, {}, []) says little of it: left out where others speak
        shown = [k for k in shown if c[k] not in (None, {}, [])] or shown
        labels.append(" ".join(_part(k, c[k], names) for k in shown))
    return _unique(labels, folders)


def _unique(labels: list[str], folders: list[str]) -> list[str]:
    """Labels two runs share get the run's folder name (its last part, or the whole name
    where that is shared too); an empty label is the folder name alone."""
    from pathlib import PurePath

    out = list(labels)
    for full in (False, True):
        for i, lab in enumerate(labels):
            if labels.count(lab) > 1 or not lab:
                name = folders[i] if full else PurePath(folders[i]).name or folders[i]
                out[i] = f"{lab} ({name})" if lab else name
        if len(set(out)) == len(out):
            return out
    return [f"{lab} #{i}" if out.count(lab) > 1 else lab for i, lab in enumerate(out)]
