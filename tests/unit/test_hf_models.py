"""model.kind=hf (issue "Your own model"): the config found offline (a model type, a
config.json, a folder, a hub id in the local cache), overrides and ppx's shape keys applied;
the split model is Hugging Face's own (the same state_dict keys, the same logits as
transformers' AutoModelForCausalLM given its weights), and a layer's weights do not depend on
the split."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ppx import config, models
from ppx.engine.rank import build_reference
from ppx.errors import UserError
from ppx.models import hf_config

tf = pytest.importorskip("transformers")

SMALL = ["model.hidden=32", "model.heads=4", "model.vocab_size=64", "model.seq_len=16", "model.layers=3"]
ARCH = {
    "llama": ["model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2}"],
    "qwen2": ["model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2}"],
    "mistral": ["model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2, sliding_window: 6}"],
    "gpt2": ["model.hf_overrides={resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}"],
    "gpt_neox": ["model.hf_overrides={intermediate_size: 64}"],  # its final norm is final_layer_norm
}


def load(arch: str, *extra: str):
    return config.load(None, ["model.kind=hf", f"model.hf_config={arch}", *SMALL, *ARCH[arch], *extra])


@pytest.mark.parametrize("arch", list(ARCH))
def test_the_split_model_is_hugging_faces_own(arch):
    cfg = load(arch)
    ours = build_reference(cfg).eval()
    theirs = tf.AutoModelForCausalLM.from_config(hf_config.resolve(cfg.model)).eval()
    assert set(ours.state_dict()) <= set(theirs.state_dict())
    missing = set(theirs.state_dict()) - set(ours.state_dict())
    assert missing <= {"lm_head.weight"}  # GPT-2's head is the tied embedding, one tensor
    theirs.load_state_dict(ours.state_dict(), strict=False)
    x, _ = models.kind("hf").make_batch(cfg.model, 0, 2, 0)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x).logits)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_layers_weights_do_not_depend_on_the_split(arch):
    cfg = load(arch)
    whole = build_reference(cfg).state_dict()
    kind = models.kind("hf")
    for units in (range(0, 2), range(2, 5)):  # [embedding, layer 0] and [layers 1-2, head]
        part = kind.build_stage(cfg.model, cfg.train.seed, 0, 2, units).state_dict()
        assert part and all(torch.equal(t, whole[k]) for k, t in part.items()), units


def test_overrides_and_shape_keys_reach_the_config():
    cfg = load("llama", "model.hf_overrides.rope_theta=5000.0")
    c = hf_config.resolve(cfg.model)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.vocab_size) == (3, 32, 4, 64)
    assert (c.intermediate_size, c.num_key_value_heads, c.head_dim) == (64, 2, 8)  # head_dim derived again
    assert c.rope_parameters["rope_theta"] == 5000.0  # a legacy name the config translates
    gpt2 = hf_config.resolve(load("gpt2").model)
    assert (gpt2.n_layer, gpt2.n_embd, gpt2.n_head) == (3, 32, 4)  # through GPT-2's attribute map


def test_shape_defaults_come_from_the_config(tmp_path):
    tf.LlamaConfig(num_hidden_layers=5, hidden_size=48, num_attention_heads=6, vocab_size=100).save_pretrained(tmp_path)
    cfg = config.load(None, ["model.kind=hf", f"model.hf_config={tmp_path}"])
    assert (cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.vocab_size) == (5, 48, 6, 100)
    cfg = config.load(None, ["model.kind=hf", f"model.hf_config={tmp_path / 'config.json'}", "model.layers=2"])
    assert cfg.model.layers == 2 and hf_config.resolve(cfg.model).num_hidden_layers == 2


def test_a_missing_path_or_folder_without_config_is_one_line(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        config.load(None, ["model.kind=hf", f"model.hf_config={tmp_path / 'nope' / 'config.json'}"])
    with pytest.raises(UserError, match="the folder holds no config.json"):
        config.load(None, ["model.kind=hf", f"model.hf_config={tmp_path}"])


def test_a_folder_named_as_a_model_type_does_not_hide_it(tmp_path, monkeypatch):
    """A run's folder named gpt2 (run.dir=gpt2) beside the run: gpt2 still names the model type
    there; a gpt2 folder that holds a config.json is that config."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    assert type(hf_config.resolve(load("gpt2").model)).__name__ == "GPT2Config"
    tf.LlamaConfig(num_hidden_layers=5, hidden_size=48, num_attention_heads=6, vocab_size=100).save_pretrained(
        tmp_path / "gpt2"
    )
    assert type(hf_config.resolve(config.load(None, ["model.kind=hf", "model.hf_config=gpt2"]).model)).__name__ == (
        "LlamaConfig"
    )


def test_a_hub_id_comes_from_the_local_cache_only(tmp_path):
    """A hub id resolves from a Hugging Face cache laid out as huggingface_hub lays it out,
    with the network off; an id not in it is one line."""
    snap = tmp_path / "models--ppx-test--tiny-qwen" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (tmp_path / "models--ppx-test--tiny-qwen" / "refs").mkdir()
    (tmp_path / "models--ppx-test--tiny-qwen" / "refs" / "main").write_text("a" * 40)
    tf.Qwen2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2).save_pretrained(
        snap
    )
    code = (
        "from ppx import config\nfrom ppx.errors import UserError\n"
        "cfg = config.load(None, ['model.kind=hf', 'model.hf_config=ppx-test/tiny-qwen'])\n"
        "print(cfg.model.layers, cfg.model.hidden)\n"
        "try:\n    config.load(None, ['model.kind=hf', 'model.hf_config=ppx-test/absent'])\n"
        "except UserError as e:\n    print(e)\n"
    )
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()
    assert first == "2 32"
    assert "'ppx-test/absent' is not a path, a model type transformers knows, or a hub id in the local" in second


def test_the_checkpoint_keys_are_named_as_hugging_face_names_them():
    cfg = load("qwen2")
    keys = set(build_reference(cfg).state_dict())
    assert {"model.embed_tokens.weight", "model.layers.2.self_attn.q_proj.bias", "model.norm.weight"} <= keys
    assert "lm_head.weight" in keys  # the untied head is its own


def test_a_value_transformers_refuses_only_as_the_model_trains_is_one_line_before_the_run():
    # a dropout of 5.0 passed every check and failed the ranks' first forward, the job started
    with pytest.raises(UserError, match=r"LlamaConfig does not train with this config: .*dropout probability"):
        hf_config.check(load("llama", "model.hf_overrides.attention_dropout=5.0"))
    hf_config.check(load("llama", "model.hf_overrides.attention_dropout=0.1"))  # (a dropout that trains)


def test_a_head_dim_of_the_configs_own_is_derived_again_for_a_new_shape():
    # Helium's config defaults head_dim to 128 rather than deriving it: at hidden 32 with 4
    # heads its attention wants 8, and the run failed at its first forward, past every check
    helium = ["model.kind=hf", "model.hf_config=helium", *SMALL, "model.hf_overrides.num_key_value_heads=2"]
    cfg = config.load(None, helium)
    assert hf_config.resolve(cfg.model).head_dim == 8
    hf_config.check(cfg)
    x, _ = models.kind("hf").make_batch(cfg.model, 0, 2, 0)
    assert build_reference(cfg)(x).shape[-1] == 64
    # a head_dim set that Helium's own attention cannot take: one line, before any run
    with pytest.raises(
        UserError, match=r"^model.kind=hf: HeliumForCausalLM fails at this config in transformers itself"
    ):
        hf_config.check(config.load(None, [*helium, "model.hf_overrides.head_dim=16"]))
