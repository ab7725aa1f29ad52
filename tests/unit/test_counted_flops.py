"""pipeline.balance=flops for a Hugging Face causal LM (`ppx.models.hf_flops`) and your own
module (`ppx.models.module_flops`): each unit's forward FLOPs counted on the model built on the
meta device, so a big vocabulary's head gets a stage of its own weight, where an even split
piled it on the last stage with its share of layers."""

from __future__ import annotations

import importlib.util

import pytest

from helpers import REPO
from ppx import config, models
from ppx.models import llama_shapes

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="model.kind=hf needs transformers"
)

SMALL = [
    "model.kind=hf",
    "model.hidden=32",
    "model.heads=4",
    "model.vocab_size=64",
    "model.seq_len=16",
    "model.layers=3",
]
GQA = "model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2}"


def load(arch: str, *extra: str):
    return config.load(None, [*SMALL, f"model.hf_config={arch}", *extra])


@needs_transformers
def test_hf_llama_weighs_its_units_as_the_llama_kind_does():
    """The same shapes by ppx's formula and counted on transformers' Llama: the matmuls, the
    causal attention and the head's vocabulary matmul agree exactly."""
    hf = load("llama", GQA)
    ours = config.load(
        None,
        ["model.preset=llama-tiny", "model.hidden=32", "model.heads=4", "model.kv_heads=2"]
        + ["model.ffn_hidden=64", "model.vocab_size=64", "model.seq_len=16", "model.layers=3"],
    )
    assert models.split_weights(hf.model, "flops") == tuple(llama_shapes.unit_flops(ours.model))


@needs_transformers
def test_gpt2s_head_gets_a_stage_of_its_own_weight():
    """GPT-2's Conv1D layers are priced as matmuls (2 x weights per token) and its tied head as
    its vocabulary matmul: with 4096 tokens of vocabulary at hidden 64 the head weighs about 5
    layers, so 8 layers over 2 stages go [embedding + 7 layers | 1 layer + head], not 5 | 5."""
    cfg = load("gpt2", "model.layers=8", "model.hidden=64", "model.vocab_size=4096", "model.seq_len=32")
    w = models.split_weights(cfg.model, "flops")
    h, seq = 64, 32
    layer = 2 * (h * 3 * h + h * h + h * 4 * h + 4 * h * h) + 4 * h * seq / 2  # c_attn, c_proj, c_fc, mlp c_proj
    assert w == (0.0,) + (layer,) * 8 + (2.0 * h * 4096,)
    assert [len(r) for r in models.split_of(cfg, 2)] == [8, 2]
    cfg.pipeline.balance = "units"
    assert [len(r) for r in models.split_of(cfg, 2)] == [5, 5]


@needs_transformers
def test_the_shipped_hf_experiments_split_as_before():
    """Their heads weigh a third of a layer (vocabulary 256): the balanced split is the even one."""
    for name, stages, counts in (("hf_gpt2_tiny_gpipe_2cpu", 2, [3, 3]), ("hf_qwen2_tiny_zbv_2cpu", 4, [2, 2, 2, 2])):
        cfg = config.load(name, [])
        assert models.split_weights(cfg.model, "flops") is not None
        assert [len(r) for r in models.split_of(cfg, stages)] == counts


@needs_transformers
def test_a_sliding_window_attends_to_fewer_positions():
    """Mistral's window of 6 over 16 positions: a token attends to 6 x (1 - 6/32) positions on
    average, not 8; the matmuls are the same."""
    window = load("mistral", "model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2, sliding_window: 6}")
    full = load("mistral", "model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2, sliding_window: null}")
    w, f = models.split_weights(window.model, "flops"), models.split_weights(full.model, "flops")
    assert f[1] - w[1] == pytest.approx(4 * 32 * (8 - 6 * (1 - 6 / 32)))
    assert w[-1] == f[-1]


@needs_transformers
def test_weights_ppx_cannot_price_leave_the_split_even():
    """Mixtral keeps its experts' weights as matrices of their own, not Linear layers: its units
    are weighed by count, as before."""
    cfg = load("mixtral", GQA, "pipeline.stages=2")
    assert models.split_weights(cfg.model, "flops") is None
    assert [len(r) for r in models.split_of(cfg, 2)] == [3, 2]


def test_your_modules_units_weigh_what_torchs_flop_counter_counts(monkeypatch):
    """examples/tiny_gpt.py, width 32 at 16 tokens: a block's Linear weights twice per token and
    its attention (counted whole: 4 x 16 x 16 x 32), the head's vocabulary matmul, the
    embedding nothing. Its shipped size splits as before (the head a sixth of a block); at a
    vocabulary of 8192 the head weighs 20 blocks and takes a stage alone."""
    monkeypatch.chdir(REPO)  # examples.tiny_gpt imports from the checkout's root
    cfg = config.load("examples/tiny_gpt.yaml", [])
    width, seq, vocab = 32, 16, 64
    block = (
        2 * seq * (width * 3 * width + width * width + width * 4 * width + 4 * width * width) + 4 * seq * seq * width
    )
    assert models.split_weights(cfg.model, "flops") == (0.0,) + (float(block),) * 4 + (2.0 * seq * width * vocab,)
    assert [len(r) for r in models.split_of(cfg, 2)] == [3, 3]
    big = config.load("examples/tiny_gpt.yaml", ["model.vocab_size=8192", "model.args.depth=8"])
    assert [len(r) for r in models.split_of(big, 2)] == [9, 1]
    big.pipeline.balance = "units"
    assert [len(r) for r in models.split_of(big, 2)] == [5, 5]


def test_a_unit_that_cannot_run_on_meta_leaves_your_split_even(monkeypatch):
    """Counted, the first unit would take a stage alone (1,2); uncounted, the split is even."""
    monkeypatch.syspath_prepend(str(REPO / "tests"))  # helpers.own_module
    cfg = config.load(
        "1f1b_2cpu",
        ["model.kind=module", "model.data=regression", "model.module=helpers.own_module:reads_values_last"]
        + ["model.layers=3", "model.hidden=16"],
    )
    assert models.split_weights(cfg.model, "flops") is None
    assert [len(r) for r in models.split_of(cfg, 2)] == [2, 1]


def test_a_batchnorm_unit_is_counted_on_two_samples(monkeypatch):
    """(Counted on one sample, BatchNorm1d refused it: the split went even, ppx split said
    llama, hf and module models only are weighed.) Per sample: each Linear 2 x 16 x 16."""
    monkeypatch.syspath_prepend(str(REPO / "tests"))  # helpers.own_module
    own = ["model.kind=module", "model.data=regression", "model.module=helpers.own_module:batch_normed"]
    cfg = config.load("1f1b_2cpu", [*own, "model.layers=3", "model.hidden=16"])
    assert models.split_weights(cfg.model, "flops") == (512.0, 0.0, 512.0)


@needs_transformers
def test_a_plan_regroups_the_stages_a_run_ran_not_those_its_config_makes_now():
    """A run's summary.json says the split it ran (an hf run from before its FLOPs were counted
    split GPT-2 at a vocabulary of 4096 evenly, 3,3, with balance=flops in its config.yaml);
    the plan reads that, and the config's split only where summary.json has none."""
    from ppx.commands.plan_inputs import _run_units

    cfg = load("gpt2", "model.layers=4", "model.hidden=64", "model.vocab_size=4096", "model.seq_len=32")
    assert _run_units(cfg, 2) == (5, 1)
    assert _run_units(cfg, 2, [3, 3]) == (3, 3)
    assert _run_units(cfg, 2, [3, 3, 0]) == _run_units(cfg, 2, [2, 2]) == (5, 1)  # not this run's: its config's


@needs_transformers
def test_an_entry_adding_a_key_the_run_has_not_is_no_floor():
    """model.hf_overrides.sliding_window=null adds a key to the run's overrides: Mistral without
    its window (the run reads null there, yet runs with the config's 4096), another model; an
    entry giving an override the run already has is a floor."""
    from ppx.config.paired import floors

    listed = "[model.hf_overrides.sliding_window=null,model.hf_overrides.intermediate_size=128]"
    cfg = config.load(
        "hf_llama_tiny_1f1b_2cpu", ["model.hf_config=mistral", "model.seq_len=8192", f"run.paired={listed}"]
    )
    assert cfg.model.hf_overrides["intermediate_size"] == 128
    assert floors(cfg) == ["model.hf_overrides.intermediate_size=128"]


def test_the_runs_line_says_how_its_split_was_made(monkeypatch):
    from ppx.report.units_line import flops_shares, units_line

    monkeypatch.chdir(REPO)
    for overrides, how in (
        ([], "split by forward FLOPs, pipeline.balance=flops"),
        (["pipeline.balance=units"], "split evenly, pipeline.balance=units"),
        (["model.split_points=[blocks.2]"], "at model.split_points"),
        (["pipeline.layers_per_stage=[2,4]"], "as pipeline.layers_per_stage gives"),
    ):
        cfg = config.load("examples/tiny_gpt.yaml", overrides)
        units = [len(r) for r in models.split_of(cfg, 2)]
        shares = flops_shares(cfg, units)
        assert sum(shares) == pytest.approx(1.0)
        assert units_line(cfg, units, shares).startswith(f"ppx: units per stage {units[0]}, {units[1]} ({how}); ")
    assert flops_shares(config.load("1f1b_2cpu", []), [2, 2]) is None  # the MLP's blocks are alike: no line
