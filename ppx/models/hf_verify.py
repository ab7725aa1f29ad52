"""Before any process starts: ppx's stage wrapper computes what transformers' own model does.

An architecture ppx finds the parts of (`ppx.models.hf_parts`) may still do something in its
own forward that the wrapper does not (a logit scale, ALiBi biases, an embedding multiplier):
its split would train a different model, silently. So every ``model.kind=hf`` run first builds
a small copy of its architecture (2 layers, hidden 32, 4 heads, vocabulary 64; the config's
other keys as given), once with ppx's wrapper and once as transformers' AutoModelForCausalLM
with the same weights, and compares their logits on a few tokens: an architecture whose logits
differ, or that the wrapper cannot run, is refused in one line. About 0.1 s."""

from __future__ import annotations

import json

import torch

from ppx.errors import UserError, said
from ppx.models import hf_config

SMALL = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 64}
SHRUNK = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size")
TOKENS = 8  # positions the check runs
THEIRS = " fails at this config in transformers itself (checked on a small copy)"


def small_copy(config):
    """``config``'s architecture at a small size (its other keys kept)."""
    data = {k: v for k, v in config.to_dict().items() if k != "model_type"}
    data.update(SMALL)
    if "n_inner" in data:  # GPT-2's MLP width (None: 4 x hidden)
        data["n_inner"] = None
    for key in SHRUNK:
        if isinstance(data.get(key), int):
            data[key] = 64
    if isinstance(data.get("num_key_value_heads"), int):
        data["num_key_value_heads"] = 2 if config.num_key_value_heads < config.num_attention_heads else 4
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(data.get(key), int) and data[key] > 4:
            data[key] = 4
    if isinstance(data.get("num_experts_per_tok"), int):
        data["num_experts_per_tok"] = min(data["num_experts_per_tok"], 2)
    # head_dim: hidden / heads where the config has it so, else another (a layout must allow that)
    if data.get("head_dim") is not None:
        same = config.head_dim * config.num_attention_heads == config.hidden_size
        data["head_dim"] = SMALL["hidden_size"] // SMALL["num_attention_heads"] * (1 if same else 2)
    if isinstance(data.get("layer_types"), list):
        data["layer_types"] = data["layer_types"][:2]
    hf_config.clear_token_ids(data, SMALL["vocab_size"])
    return type(config)(**data)


def check(config) -> None:
    """UserError in one line unless the wrapper's logits equal transformers' on a small copy
    (once per process for each small copy: configs that differ only in size share it)."""
    tf = hf_config.transformers()
    arch = tf.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)].__name__
    try:
        small = small_copy(config)
    except Exception as e:
        raise _refuse(arch, f"no small copy of it to check: {said(e)[:200]}") from None
    key = f"{type(small).__name__} {json.dumps(small.to_dict(), sort_keys=True, default=str)}"
    if key not in _VERDICTS:
        try:
            _compare(small)
            _VERDICTS[key] = None
        except _Differs as e:
            _VERDICTS[key] = str(e)
    if _VERDICTS[key] and _VERDICTS[key].startswith(THEIRS):  # the config's, not the split's
        raise UserError(f"model.kind=hf: {arch}{_VERDICTS[key]}")
    if _VERDICTS[key]:
        raise _refuse(arch, _VERDICTS[key])
    if key not in _TRAINS:
        _TRAINS[key] = _train_forward(small)
    if _TRAINS[key]:
        raise UserError(f"model.kind=hf: {type(config).__name__} does not train with this config: {_TRAINS[key]}")


_VERDICTS: dict[str, str | None] = {}  # a small copy -> why the wrapper differs (None: it does not)
_TRAINS: dict[str, str | None] = {}  # a small copy -> why its training forward fails (None: it runs)


def _train_forward(small) -> str | None:
    """Why one training-mode forward of ppx's wrapper on ``small`` fails, or None: a value
    transformers takes into its config and refuses only as the model trains (a dropout of 5.0
    failed the ranks' first forward, after the processes had started)."""
    from ppx.models import hf

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            stage = hf.HFStage(small, 0, range(small.num_hidden_layers + 2)).train()
            with torch.no_grad():
                stage(torch.randint(0, SMALL["vocab_size"], (2, TOKENS)))
        except Exception as e:
            return said(e)[:300]
    return None


def _refuse(arch: str, why: str) -> UserError:
    return UserError(f"model.kind=hf: ppx cannot split {arch}: {why} (model.kind=module splits any nn.Module)")


class _Differs(Exception):
    pass


def _compare(small) -> None:
    """Raise _Differs saying how ppx's wrapper and transformers' model differ on ``small``."""
    from ppx.models import hf

    tf = hf_config.transformers()
    n = small.num_hidden_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            ours = hf.HFStage(small, 0, range(n + 2)).eval()
            theirs = tf.AutoModelForCausalLM.from_config(small).eval()
            missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
            tokens = torch.randint(0, SMALL["vocab_size"], (2, TOKENS))
            with torch.no_grad():
                got, want = ours(tokens), theirs(tokens).logits
        except UserError as e:
            raise _Differs(str(e).split(": ", 2)[-1]) from None
        except Exception as e:
            raise _Differs(_fails(small, e)) from None
    if unexpected or set(missing) - {f"{ours.names.head_name}.weight"}:
        raise _Differs(f"its weights are not the stages' ({', '.join((unexpected or missing)[:3])})")
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        diff = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
        raise _Differs(f"its own forward does more than its parts (logits differ by up to {diff:.3g} on a small copy)")


def _fails(small, e: Exception) -> str:
    """Why ppx's wrapper failed on ``small``: transformers' own model fails there too (a shape
    its code does not take: Helium's attention wants heads x head_dim = hidden), or only ours."""
    tf = hf_config.transformers()
    try:
        with torch.no_grad():
            tf.AutoModelForCausalLM.from_config(small).eval()(torch.randint(0, SMALL["vocab_size"], (2, TOKENS)))
    except Exception as theirs:
        return f"{THEIRS}: {said(theirs)[:200]}"
    return f"its layers do not run in ppx's stage wrapper: {said(e)[:200]}"
