"""Your own model's errors (issue "Your own model"), each one line before any work starts: what
`ppx run` prints after "ppx: error: " (tests/e2e/test_bad_input.py runs two of them through the
command: one line, exit 2, no run directory)."""

from __future__ import annotations

import pytest

from helpers import REPO
from ppx import config
from ppx.errors import UserError

pytest.importorskip("transformers")

# helpers/own_module.py's: 4 x (Linear, Tanh), 4 units (an nn.Sequential's own children, as they are)
SEQUENTIAL = ["1f1b_2cpu", "model.kind=module", "model.data=regression", "model.args={width: 16, depth: 4}"]
# helpers/own_module.py's chain: inp, blocks.0-2, out, whose forward does what model.args.way says
CHAIN = [
    *SEQUENTIAL[:3],
    "model.module=helpers.own_module:chain",
    "model.units=[inp,blocks,out]",
    "model.hidden=16",
    "model.layers=5",
]


CASES = {
    "hf architecture whose own forward does more than its parts": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_config=cohere"],
        "ppx cannot split CohereForCausalLM: its own forward does more than its parts (logits differ by up to",
    ),
    "hf config of no causal LM": (["1f1b_2cpu", "model.kind=hf", "model.hf_config=t5"], "T5Config has no causal LM"),
    "hf config path that does not exist": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_config=/no/such/config.json"],
        "model.hf_config /no/such/config.json does not exist",
    ),
    "hf hub id not in the local cache": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_config=no-org/no-model"],
        "is not a path, a model type transformers knows, or a hub id in the local Hugging Face cache",
    ),
    "hf override that is not a config key": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_overrides.n_layers=2"],
        "model.hf_overrides: n_layers is not a key of LlamaConfig",
    ),
    "hf override of a shape key against ppx's": (  # GPT-2's alias; ppx would split 4 layers of 2
        ["hf_gpt2_tiny_gpipe_2cpu", "model.hf_overrides={n_layer: 2}"],
        "model.hf_overrides.n_layer=2 makes the config's num_hidden_layers 2 but model.layers=4: ppx splits and "
        "sizes the model by model.layers, which sets it; give model.layers=2 instead",
    ),
    "hf override of the width against ppx's": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_overrides.hidden_size=32"],
        "model.hf_overrides.hidden_size=32 makes the config's hidden_size 32 but model.hidden=64",
    ),
    "hf legacy name of the width against ppx's": (  # Bloom's n_embed sets hidden_size in its __init__
        ["1f1b_2cpu", "model.kind=hf", "model.hf_config=bloom", "model.hidden=64", "model.heads=4"]
        + ["model.vocab_size=256", "model.seq_len=32", "model.hf_overrides={n_embed: 32}"],
        "model.hf_overrides (n_embed) makes the config's hidden_size 32 but model.hidden=64",
    ),
    "hf overrides that are not config keys": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_overrides.foo=1", "model.hf_overrides.bar=2"],
        "model.hf_overrides: bar, foo are not keys of LlamaConfig",
    ),
    "hf override of a value transformers cannot build": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_overrides.intermediate_size=-5"],
        "transformers cannot build LlamaConfig from this config: RuntimeError: Trying to create tensor with negative",
    ),
    "hf override naming no activation": (
        ["hf_llama_tiny_1f1b_2cpu", "model.hf_overrides.hidden_act=bogus"],
        "transformers cannot build LlamaConfig from this config: KeyError: 'bogus'",
    ),
    "hf heads that do not divide the width": (  # the validator's reason, not only its name
        ["hf_llama_tiny_1f1b_2cpu", "model.heads=3"],
        "validate_architecture': ValueError: The hidden size (64) is not a multiple of the number of attention heads",
    ),
    "hf with llama's kv_heads": (
        ["hf_llama_tiny_1f1b_2cpu", "model.kv_heads=1"],
        "model.kv_heads is llama's key; model.kind=hf reads it from its config: give model.hf_overrides.num_key_value_heads=1",
    ),
    "hf more stages than units": (
        ["hf_llama_tiny_1f1b_2cpu", "pipeline.stages=8", "model.layers=2"],
        "8 stages but model.layers + 2 = 4",
    ),
    "hf tied weights on torch's executor": (
        ["hf_gpt2_tiny_gpipe_2cpu", "pipeline.executor=torch"],
        "torch's executor does not sum the two stages' gradients",
    ),
    "module function that returns no module": (
        ["examples/tiny_gpt.yaml", "model.module=builtins:dict"],
        "model.module=builtins:dict returned dict, not an nn.Module",
    ),
    "module split name that does not exist": (
        ["examples/tiny_gpt.yaml", "model.split_points=[blocks.9]"],
        "model.split_points: 'blocks.9' is not a unit (units: embed, blocks.0",
    ),
    "module units that do not cover it": (
        ["examples/tiny_gpt.yaml", "model.units=[embed,head]"],
        "model.units do not cover the module: blocks.0.norm1.weight",
    ),
    # 1f1b_2cpu's own model.layers (4, the MLP's) kept for a module of 3 units: say the count to give
    "module whose units are not the experiment's model.layers": (
        [*SEQUENTIAL[:3], "model.module=helpers.own_module:classifier", "model.hidden=16"],
        "model.layers=4 but the module has 3 units: give model.layers=3 (or no model.layers, in the experiment "
        "file too)",
    ),
    "module more stages than units": (
        ["examples/tiny_gpt.yaml", "pipeline.stages=8"],
        "8 stages but the module has 6 units",
    ),
    "module tied weights on torch's executor": (
        ["examples/tiny_gpt.yaml", "pipeline.executor=torch"],
        "embed.tokens.weight is shared by several units; torch's executor does not sum its copies",
    ),
    "module units that do not chain": (
        [*SEQUENTIAL, "model.module=helpers.own_module:build", "model.layers=4", "model.hidden=64"],
        "model.kind=module: unit 0 fails on its input (shape (8, 64), torch.float32): RuntimeError: ",
    ),
    "module batch function that fails": (
        [
            *SEQUENTIAL,
            "model.module=helpers.own_module:build",
            "model.layers=4",
            "model.batch_fn=helpers.own_module:batch_that_fails",
        ],
        "model.batch_fn=helpers.own_module:batch_that_fails: step 0's batch failed: RuntimeError: no dataset here",
    ),
    "module stage that would begin with integers": (  # (its gradient could not go back)
        [
            *SEQUENTIAL,
            "model.module=helpers.own_shapes:quantized",
            "model.hidden=16",
            "pipeline.layers_per_stage=[1,3]",
        ],
        "model.kind=module: stage 1 would begin at unit 1, handed int64 (shape (8, 16)) by unit 0; a stage receives "
        "floating point, as its input's gradient goes back to the stage before: cut elsewhere",
    ),
    "module units that do not chain under torch's executor": (
        [*SEQUENTIAL, "model.module=helpers.own_module:build", "model.layers=4", "model.hidden=64"]
        + ["pipeline.executor=torch"],
        "model.kind=module: unit 0 fails on its input (shape (8, 64), torch.float32): RuntimeError: ",
    ),
    "module whose forward adds a skip across units": (
        [*CHAIN, "model.args={way: skip}"],
        "model.module=helpers.own_module:chain: its forward does more than call its units in turn: "
        "add(blocks_2, inp) before unit out; ppx's split runs model.units one after the other",
    ),
    "module whose forward calls a unit twice": (
        [*CHAIN, "model.args={way: twice}"],
        "its forward calls unit blocks.0 2 times, where the split runs each unit once",
    ),
    "module units in another order than its forward's": (
        [*CHAIN, "model.units=[inp,blocks,out]", "model.units=[out,blocks,inp]"],
        "its forward calls its units in the order inp, blocks.0, blocks.1, blocks.2, out, where model.units gives out,",
    ),
    "module whose forward changes a unit's output in place": (
        [*CHAIN, "model.args={way: in_place}"],
        "its forward does more than call its units in turn: mul_(blocks_2, 2) before unit out",
    ),
    "module whose forward calls a unit under torch.no_grad()": (  # (ppx trained it, and the units before it)
        [*CHAIN, "model.args={way: no_grad}"],
        "model.module=helpers.own_module:chain: its forward calls unit blocks.1 with autograd off (torch.no_grad(), "
        "inference_mode), so no gradient reaches it or the units before it, where ppx's split runs every unit with autograd on and would "
        "train them: freeze their parameters in your build instead (requires_grad_(False))",
    ),
    "module build that reads model.layers": (  # (the advice was model.layers=6, then 8, ...)
        [*SEQUENTIAL, "model.module=helpers.own_module:build_from_layers", "model.hidden=16", "model.layers=4"],
        "model.layers=4 but the module has 6 units, and 8 with model.layers=6: your build reads model.layers, which "
        "ppx sets to the number of units; give the number of blocks in model.args instead (model.args.depth)",
    ),
    "module whose last unit fails on its input": (  # (left to the run: a rank failed after the claim)
        [*SEQUENTIAL, "model.module=helpers.own_module:last_unit_mismatch", "model.layers=3", "model.hidden=16"],
        "model.kind=module: the last unit 2 fails on its input (shape (8, 16), torch.float32): RuntimeError: a and "
        "b must have same reduction dim, but got [8, 16] X [32, 16]",
    ),
    "module loss function that fails": (  # (left to the run, as the last unit)
        [*SEQUENTIAL, "model.module=helpers.own_module:build", "model.hidden=16"]
        + ["model.loss_fn=helpers.own_module:loss_on_three_columns"],
        "model.loss_fn=helpers.own_module:loss_on_three_columns fails on the last unit's output (shape (8, 16), "
        "torch.float32) and the targets (shape (8, 16), torch.float32): RuntimeError: Attempting to broadcast a "
        "dimension of length 3",
    ),
    "module with a lazy layer": (  # (a rank failed on building the model, after the claim)
        [*SEQUENTIAL, "model.module=helpers.own_module:lazy", "model.hidden=16"],
        "model.module=helpers.own_module:lazy: its build leaves 0.weight uninitialised (a lazy module: nn.LazyLinear",
    ),
    "module whose forward changes the last unit's output": (
        [*CHAIN, "model.args={way: scaled}"],
        "its forward returns mul(out, 2), not the last unit's output",
    ),
    "module split point at the first unit": (
        ["examples/tiny_gpt.yaml", "model.split_points=[embed]"],
        "model.split_points: embed is the first unit, where stage 0 begins: leave it out; give the unit where stage 1 "
        "begins, in forward order",
    ),
    "module split points too few": (
        ["examples/tiny_gpt.yaml", "pipeline.stages=3", "model.split_points=[blocks.2]"],
        "model.split_points: 1 point for 3 stages; give the 2 units where stages 1-2 begin, in forward order",
    ),
    "module split points out of order": (
        ["examples/tiny_gpt.yaml", "pipeline.stages=3", "model.split_points=[blocks.2,blocks.1]"],
        "model.split_points: the points are not in forward order; give the 2 units where stages 1-2 begin, in "
        "forward order",
    ),
    "module class whose constructor takes no model section": (
        [*SEQUENTIAL, "model.module=torch.nn:Linear"],
        "(ppx called the class with the model section: name a function that builds it)",
    ),
    "module given as a file path": (
        ["examples/tiny_gpt.yaml", "model.module=examples/tiny_gpt.py:build"],
        "model.module=examples/tiny_gpt.py:build: give the module's import path (package.module:function, dots, no "
        ".py), not a file's",
    ),
    "module that is not on the path": (
        ["examples/tiny_gpt.yaml", "model.module=nosuch.models:build"],
        "model.module=nosuch.models:build: cannot import nosuch.models: ModuleNotFoundError: No module named 'nosuch' "
        "(ppx imports it from the current directory, ",
    ),
    "module with an empty ModuleList for units": (
        ["examples/tiny_gpt.yaml", "model.args.depth=0"],
        "model.units: blocks is an empty ModuleList: no unit to run",
    ),
    "module whose last unit returns a tuple": (
        [*SEQUENTIAL, "model.module=helpers.own_module:pair_last", "model.layers=3", "model.hidden=16"],
        "model.kind=module: the last unit 2 returns tuple; ppx's loss (MSE against the targets, model.data=regression) "
        "takes one tensor: return it alone, or give model.loss_fn",
    ),
    "module whose output does not fit the targets": (
        [*SEQUENTIAL, "model.module=helpers.own_module:narrow_head", "model.layers=3", "model.hidden=16"],
        "model.kind=module: the last unit 2 returns shape (8, 1) where ppx's loss (MSE against the targets, "
        "model.data=regression) wants (8, 16), the targets'",
    ),
    "module whose scores do not fit its own labels": (
        [*SEQUENTIAL[:3], "model.module=helpers.own_module:classifier", "model.batch_fn=helpers.own_module:classes"]
        + ["model.layers=3", "model.args={classes: 1}", "model.data=tokens"],
        "model.kind=module: the last unit 2 returns shape (8, 1) where ppx's loss (next-token cross-entropy, "
        "model.data=tokens) wants (8, 'classes'), a score per class for each target, more classes than the first "
        "microbatch's largest label (8)",
    ),
    "module whose loss is not one number": (
        [*SEQUENTIAL, "model.module=helpers.own_module:build", "model.layers=4", "model.hidden=16"]
        + ["model.loss_fn=helpers.own_module:loss_per_sample"],
        "model.loss_fn=helpers.own_module:loss_per_sample returns shape (8,) for a microbatch; ppx needs one number",
    ),
    "module of floats given token ids": (
        [*SEQUENTIAL, "model.module=helpers.own_module:build", "model.layers=4", "model.data=tokens"],
        "(model.data=tokens hands on token ids; model.data=regression, or model.batch_fn, floats)",
    ),
    "module split points beside another split": (
        ["examples/tiny_gpt.yaml", "model.split_points=[blocks.2]", "pipeline.layers_per_stage=[2,4]"],
        "model.split_points split the units [3, 3], pipeline.layers_per_stage [2, 4]: give one of them",
    ),
    "module tied weights under the tracer": (
        ["examples/tiny_gpt.yaml", "pipeline.split=tracer"],
        "torch's tracer split gives each stage its own copy",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_one_line_before_any_work(case, monkeypatch):
    (experiment, *overrides), expected = CASES[case]
    monkeypatch.chdir(REPO)  # examples/ and the module paths are the checkout's
    monkeypatch.syspath_prepend(str(REPO / "tests"))  # helpers.own_module
    with pytest.raises(UserError) as e:
        config.load(experiment, overrides)
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_function_that_raises_without_a_message_is_named_by_its_type(monkeypatch):
    """(It crashed the check with an IndexError, blamed on the experiment file.)"""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    with pytest.raises(UserError) as e:
        config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], "model.module=helpers.own_module:build_that_says_nothing"])
    line = (
        REPO.joinpath("tests/helpers/own_module.py")
        .read_text()
        .splitlines()
        .index("    raise ValueError()  # an exception without a message: its type is the one line")
    )
    # (and where the user's code raised it, from the working folder)
    want = f"model.module=helpers.own_module:build_that_says_nothing raised ValueError (at tests/helpers/own_module.py:{line + 1})"
    assert str(e.value) == want


def test_a_model_function_reads_its_args_as_attributes_wherever_it_is_called(monkeypatch):
    """docs/running.md's `a = model.args; a.width`: the model and batch functions get the model
    section as a DictConfig both while the config loads and where the ranks build their stages."""
    from ppx.models import module, module_spec

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    own = ["model.module=helpers.own_module:build_by_attribute", "model.batch_fn=helpers.own_module:batch_by_attribute"]
    cfg = config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], *own, "model.layers=4", "model.hidden=16"])
    assert isinstance(cfg.model.args, dict)  # the resolved config's: a plain dict
    assert len(module_spec.build(cfg.model)) == 4
    x, y = module.make_batch(cfg.model, 0, 8, 0)  # the batch function too
    assert x.shape == y.shape == (8, 16)
    stage = module.build_stage(cfg.model, 0, 1, 2, range(2, 4))
    assert [n for n, _ in stage.named_parameters()] == ["2.0.weight", "2.0.bias", "3.0.weight", "3.0.bias"]


def test_an_nn_sequentials_children_are_its_units_as_they_are_and_a_named_sequential_its_childrens(monkeypatch):
    """docs/config.md's model.units: null takes the model's own children, each one unit (a
    Sequential block too: they were taken apart, Linear from its Tanh, into parameter-free
    units); a Sequential named in model.units stands for its children."""
    from ppx.models import module_spec

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    cfg = config.load(
        SEQUENTIAL[0], [*SEQUENTIAL[1:], "model.module=helpers.own_module:build", "model.layers=4", "model.hidden=16"]
    )
    assert module_spec.described(cfg.model)[1] == ["0", "1", "2", "3"]
    cfg.model.units = ["0", "1", "2", "3"]
    assert module_spec.described(cfg.model)[1] == [f"{k}.{j}" for k in range(4) for j in range(2)]


def test_model_args_written_without_a_space_after_the_colon_is_refused(monkeypatch):
    """YAML reads ``{width:32}`` as one key, "width:32", with no value: the model would build at
    its default width with a stray key beside it, so the mistake is named with the fix."""
    monkeypatch.chdir(REPO)
    with pytest.raises(UserError) as e:
        config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:-1], "model.args={width:16, depth: 4}"])
    assert str(e.value) == (
        "model.args: 'width:16' is a key with no value; write {width: 16} with a space after the colon, "
        "or model.args.width=16"
    )


def test_a_config_with_split_points_loads_again_as_it_was_saved(monkeypatch, tmp_path):
    """The check writes the split points' split to pipeline.layers_per_stage: a run's
    config.yaml holds both, and loads again (ppx run <run>/config.yaml), as does a run.paired
    entry beside it (a config derived from the checked one); a split of its own beside the
    points is still refused (the case above)."""
    monkeypatch.chdir(REPO)
    cfg = config.load("examples/tiny_gpt.yaml", ["model.split_points=[blocks.2]"])
    assert cfg.pipeline.layers_per_stage == [3, 3]
    (tmp_path / "config.yaml").write_text(config.to_yaml(cfg))
    again = config.load(str(tmp_path / "config.yaml"), [])
    assert again.pipeline.layers_per_stage == [3, 3] and again.model == cfg.model
    paired = config.load(
        "examples/tiny_gpt.yaml", ["model.split_points=[blocks.2]", "run.paired=[pipeline.schedule=gpipe]"]
    )
    assert paired.run.paired == ["pipeline.schedule=gpipe"]


def test_a_forward_that_only_calls_its_units_passes_and_one_fx_cannot_read_is_named(monkeypatch):
    """A tuple whose first item is the last unit's output is the forward's output; a forward
    torch.fx cannot trace is not checked, and `ppx run` says so."""
    from ppx.commands.run import _forward_unchecked

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    for way in ("plain", "tuple"):  # (and the chain's forward takes an optional mask, None as ppx calls it)
        assert _forward_unchecked(config.load(CHAIN[0], [*CHAIN[1:], f"model.args={{way: {way}}}"])) is None
    # a classifier's 10 scores against its own labels (not ppx's vocabulary): what the loss takes
    classify = ["model.module=helpers.own_module:classifier", "model.batch_fn=helpers.own_module:classes"]
    config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:3], *classify, "model.layers=3", "model.data=tokens"])
    cfg = config.load(CHAIN[0], [*CHAIN[1:], "model.args={way: branch}"])
    assert _forward_unchecked(cfg).startswith(
        "ppx: note: torch.fx cannot trace the forward of model.module=helpers.own_module:chain (TraceError: "
    )
    # torch's tracer split traces the units' chain too, not the forward: refused alike
    with pytest.raises(UserError, match="its forward does more than call its units in turn: add"):
        config.load(CHAIN[0], [*CHAIN[1:], "model.args={way: skip}", "pipeline.split=tracer"])


def test_a_package_your_module_lacks_is_named_without_a_hint_at_the_path(monkeypatch):
    """The module was found: what it imports is missing, not the module (no hint at the path)."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    with pytest.raises(UserError) as e:
        config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], "model.module=helpers.missing_dependency:build"])
    assert str(e.value) == (
        "model.module=helpers.missing_dependency:build: cannot import helpers.missing_dependency: "
        "ModuleNotFoundError: No module named 'ppx_no_such_dependency'"
    )


def test_a_build_that_reads_a_value_is_checked_and_split_as_any_other(monkeypatch):
    """A build calling ``.item()`` on a weight: the meta device refuses it, so the checks build
    it on the CPU (it was refused: "Tensor.item() cannot be called on meta tensors")."""
    from ppx.models import module_flops

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    own = ["model.module=helpers.own_module:build_reading_values", "model.hidden=16"]
    cfg = config.load(SEQUENTIAL[0], [*SEQUENTIAL[1:], *own])
    assert cfg.model.layers == 4
    assert module_flops.unit_flops(cfg.model) == [2 * 16 * 16] * 4  # (each unit's forward FLOPs, counted on meta)
