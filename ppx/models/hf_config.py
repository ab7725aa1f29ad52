"""A Hugging Face model's config for ``model.kind=hf``, offline: from a model type
(``llama``, ``qwen2``, ``mistral``, ``gpt2``, ...: transformers' defaults), a ``config.json``, a
folder holding one, or a hub id already in the local Hugging Face cache. Nothing is downloaded:
ppx sets ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` before transformers is imported.

``model.hf_overrides`` sets config keys on top, and ppx's own shape keys map onto the config's:
``model.layers`` -> ``num_hidden_layers``, ``model.hidden`` -> ``hidden_size``, ``model.heads`` ->
``num_attention_heads``, ``model.vocab_size`` -> ``vocab_size`` (GPT-2's n_layer, n_embd and
n_head through its attribute map). The config's own values fill those ppx keys first (as a
preset does), so keys given in the experiment or on the command line win."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from ppx.errors import UserError, said

SHAPE_KEYS = {  # ppx's model key -> the Hugging Face config's
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "vocab_size": "vocab_size",
}
INSTALL = (
    "model.kind=hf needs Hugging Face transformers: make setup in the checkout (or pip install -e '.[hf]' there, "
    "or pip install transformers)"
)


# offline and quiet: what transformers reads as it is imported, where not set otherwise
IMPORT_SETTINGS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
# what any model.kind=hf model's build imports (4-5 s), for a process whose forks build one to import first
MODEL_MODULES = ("transformers.modeling_utils", "transformers.models.auto.modeling_auto")


def transformers():
    """The transformers module, offline; one line when it is not installed."""
    for key, value in IMPORT_SETTINGS.items():
        os.environ.setdefault(key, value)
    try:
        import transformers as tf
    except ImportError:
        raise UserError(INSTALL) from None
    return tf


def _base(source: str):
    """The config ``source`` names, before any override."""
    tf = transformers()
    path = Path(source).expanduser()
    # a model type's name is itself, though a folder of that name (a run's: run.dir=gpt2) is here
    named = source in tf.CONFIG_MAPPING and path.is_dir() and not (path / "config.json").is_file()
    if (path.is_file() or path.is_dir()) and not named:
        folder = path if path.is_dir() else path.parent
        if path.is_dir() and not (path / "config.json").is_file():
            raise UserError(f"model.hf_config {source}: the folder holds no config.json")
        try:
            data = json.loads((path if path.is_file() else path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"model.hf_config {source}: not a readable config.json ({e})") from None
        kind = data.get("model_type")
        if kind not in tf.CONFIG_MAPPING:
            raise UserError(f"model.hf_config {source}: model_type {kind!r} is not one transformers knows")
        return tf.CONFIG_MAPPING[kind].from_dict({k: v for k, v in data.items() if k != "model_type"}), str(folder)
    if source.endswith(".json") or source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise UserError(f"model.hf_config {source} does not exist")
    if source in tf.CONFIG_MAPPING:  # a model type: transformers' default config of it
        return tf.CONFIG_MAPPING[source](), None
    try:  # a hub id, from the local cache only
        return tf.AutoConfig.from_pretrained(source, local_files_only=True), None
    except Exception:
        raise UserError(
            f"model.hf_config {source!r} is not a path, a model type transformers knows, or a hub id in the "
            "local Hugging Face cache (ppx never downloads; put its config.json in a folder and give the path)"
        ) from None


def _heads(config) -> int | None:
    return getattr(config, "num_attention_heads", None)


def _key(config, ours: str) -> str:
    name = SHAPE_KEYS[ours]
    return config.attribute_map.get(name, name)


@functools.lru_cache(maxsize=16)
def resolved(source: str, overrides: str, shapes: str):
    """The config with ``overrides`` (a JSON object) and ``shapes`` (ppx's shape keys, JSON)
    applied (`keys`), once per set of them; a new config object built from them, so derived
    keys (head_dim) follow."""
    base, _ = _base(source)
    data = base.to_dict()
    given = json.loads(overrides)
    for ours, value in json.loads(shapes).items():
        data[_key(base, ours)] = value
    shape = json.loads(shapes)
    if "head_dim" not in given and (shape.get("hidden") != base.hidden_size or shape.get("heads") != _heads(base)):
        # derived from hidden / heads unless set: by the config where it derives it (None), here
        # where its default is a number of its own (Helium's 128, which its attention cannot take)
        hidden, heads = data.get(_key(base, "hidden")), data.get(_key(base, "heads"))
        if data.get("head_dim") is not None and isinstance(hidden, int) and heads and hidden % heads == 0:
            data["head_dim"] = hidden // heads
        else:
            data.pop("head_dim", None)
    if "layer_types" not in given and shape.get("layers") != base.num_hidden_layers:
        data.pop("layer_types", None)  # one per layer: derived again for the new count unless set
    translated = {k: _translates(base, k, v) for k, v in given.items() if k not in data and k not in base.attribute_map}
    unknown = [k for k, sets in translated.items() if not sets]
    if unknown:
        hint = ""
        if any(":" in k and given[k] is None for k in unknown):  # YAML read {key:1} as one key
            hint = " (write {key: value} with a space after the colon, or model.hf_overrides.key=value)"
        what = "is not a key" if len(unknown) == 1 else "are not keys"
        raise UserError(f"model.hf_overrides: {', '.join(unknown)} {what} of {type(base).__name__}{hint}")
    for sets in translated.values():  # a legacy name's value wins over the keys it sets
        for k in sets:
            data.pop(k, None)
    data.update({base.attribute_map.get(k, k): v for k, v in given.items()})
    data.pop("model_type", None)
    clear_token_ids(data, data.get(_key(base, "vocab_size")), keep=given)
    try:
        return type(base)(**data)
    except Exception as e:
        raise UserError(f"model.hf_config with those keys: {said(e)}") from None


def _translates(base, key: str, value) -> set[str]:
    """The config's keys a key it does not list sets (a legacy name it translates, as Llama's
    ``rope_theta`` into ``rope_parameters``); none for a typo, which only adds itself."""
    try:
        plain, made = type(base)().to_dict(), type(base)(**{key: value}).to_dict()
    except Exception:
        return set()
    return {k for k in made if k != key and made[k] != plain.get(k)}


def clear_token_ids(data: dict, vocab, keep=()) -> None:
    """Pad, bos and eos ids of config ``data`` past a vocabulary of ``vocab`` (one made
    smaller) set to None, but those in ``keep`` (given by the user)."""
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if key not in keep and isinstance(data.get(key), int) and isinstance(vocab, int) and data[key] >= vocab:
            data[key] = None


def resolve(model):
    """``model``'s (the config's model section) Hugging Face config, shape keys applied."""
    return resolved(*keys(model))


def keys(model) -> tuple[str, str, str]:
    """What ``model``'s Hugging Face config is resolved from, as hashable text: (model.hf_config,
    model.hf_overrides as JSON, ppx's shape keys as JSON)."""
    if not model.hf_config:
        raise UserError("model.kind=hf needs model.hf_config (a model type, a config.json or folder, or a hub id)")
    overrides = json.dumps(dict(model.hf_overrides or {}), sort_keys=True)
    shapes = json.dumps({k: getattr(model, k) for k in SHAPE_KEYS}, sort_keys=True)
    return model.hf_config, overrides, shapes


def shape_defaults(model) -> dict:
    """ppx's shape keys as the config (with ``model.hf_overrides``) has them: the defaults
    under the experiment's keys, as a preset's are."""
    if not model.hf_config:
        return {}
    base, _ = _base(model.hf_config)
    given = dict(model.hf_overrides or {})
    out = {}
    for ours, name in SHAPE_KEYS.items():
        value = given.get(name, given.get(base.attribute_map.get(name, name), getattr(base, name, None)))
        if value is not None:
            out[ours] = value
    return out


def _shape_keys_agree(model, config) -> None:
    """The config built (``config``) has ppx's shape keys' values (`SHAPE_KEYS`): ppx splits and
    sizes the model by its keys, and a ``model.hf_overrides`` key that sets one of them (by the
    config's name, an alias as GPT-2's n_layer, or a legacy name as Bloom's n_embed) would build
    another model under that split (a layer count ppx does not know of, or stages that hand on
    tensors of another width)."""
    given = dict(model.hf_overrides or {})
    for ours, name in SHAPE_KEYS.items():
        value, want = getattr(config, name, None), getattr(model, ours)
        if value is None or want is None or value == want:
            continue
        key = next((k for k in (name, config.attribute_map.get(name, name)) if k in given), None)
        which = f"model.hf_overrides.{key}={given[key]!r}" if key else f"model.hf_overrides ({', '.join(given)})"
        raise UserError(
            f"{which} makes the config's {name} {value!r} but model.{ours}={want}: ppx splits and sizes the model "
            f"by model.{ours}, which sets it; give model.{ours}={value!r} instead"
        )


def _one_line(what: str, fn, *args):
    """``fn(*args)``, any error but a UserError of ours made one line: ``model.kind=hf: <what>: <error>``."""
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"model.kind=hf: {what}: {said(e)}") from e


def check(cfg) -> None:
    """Before any process starts: the config resolves, ppx can split its architecture, the
    sequence fits its positions, and tied weights sit where ppx sums their gradients."""
    from ppx.models import hf, hf_parts, hf_verify
    from ppx.schedules import registry

    config = resolve(cfg.model)
    _shape_keys_agree(cfg.model, config)
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if heads and kv and heads % kv:
        raise UserError(
            f"model.heads={heads} is not a multiple of the config's num_key_value_heads={kv}: set "
            "model.hf_overrides={num_key_value_heads: ...} to one that divides it"
        )
    if heads and config.hidden_size % heads and "head_dim" not in (cfg.model.hf_overrides or {}):
        raise UserError(f"model.hidden={config.hidden_size} is not divisible by model.heads={heads}")
    # transformers' own checks of a value come as its errors, from deep in its code: one line each
    name = type(config).__name__
    meta = _one_line(f"transformers cannot build {name} from this config", hf.meta_model, config)
    hf_parts.find(meta, config.num_hidden_layers)
    # the wrapper computes what transformers' own forward does
    _one_line(f"{name}'s forward fails with this config", hf_verify.check, config)
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and cfg.model.seq_len > limit:
        raise UserError(f"model.seq_len={cfg.model.seq_len} is more than the config's {limit} positions")
    if getattr(config, "tie_word_embeddings", False) and registry.runs_on_torch(
        cfg.pipeline.schedule, cfg.pipeline.executor
    ):
        raise UserError(
            "model.kind=hf with tied embeddings: torch's executor does not sum the two stages' gradients; "
            "use ppx's runtime, or model.hf_overrides={tie_word_embeddings: false}"
        )
