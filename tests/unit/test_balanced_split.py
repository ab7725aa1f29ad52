"""pipeline.balance: the default split of a model's units, balanced by their forward FLOPs
(`ppx.models.split.balanced_counts`, llama's `unit_flops`) or even."""

from __future__ import annotations

import itertools

import pytest

from ppx import config, models
from ppx.config import resolve_schedule
from ppx.errors import UserError
from ppx.models.split import balanced_counts, even_counts


def _compositions(n: int, stages: int):
    """Every split of n units into ``stages`` contiguous non-empty stages."""
    for cuts in itertools.combinations(range(1, n), stages - 1):
        yield [b - a for a, b in zip((0, *cuts), (*cuts, n))]


def _heaviest(weights, counts) -> float:
    out, start = 0.0, 0
    for c in counts:
        out = max(out, sum(weights[start : start + c]))
        start += c
    return out


@pytest.mark.parametrize(
    "weights, stages",
    [
        ((1.0,) * 10, 4),
        ((0.0,) + (1.0,) * 8 + (1 / 3,), 4),
        ((0.0,) + (1.0,) * 6 + (4.3,), 2),
        ((0.0,) + (1.0,) * 6 + (4.3,), 3),
        ((5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0), 3),
        ((0.0, 2.0, 0.5, 0.5, 3.0, 1.0, 1.0, 0.1), 5),
        ((0.0,) + (1.0,) * 12 + (5.43,), 4),  # GPT-2's head: 5,4,4,1, not 4,4,5,1
    ],
)
def test_no_split_has_a_lighter_heaviest_stage(weights, stages):
    """Against every contiguous split: none's heaviest stage is lighter; among the splits as
    light, none has stages more alike (a smaller sum of squared stage weights); and among
    those, none is nearer the even one."""
    got = list(balanced_counts(weights, stages))
    assert len(got) == stages and sum(got) == len(weights) and min(got) >= 1
    best = min(_heaviest(weights, c) for c in _compositions(len(weights), stages))
    assert _heaviest(weights, got) == pytest.approx(best)
    light = [c for c in _compositions(len(weights), stages) if _heaviest(weights, c) <= best * (1 + 1e-9)]
    alike = min(_squares(weights, c) for c in light)
    assert _squares(weights, got) == pytest.approx(alike)
    even = even_counts(len(weights), stages)
    moved = min(sum(abs(a - b) for a, b in zip(c, even)) for c in light if _squares(weights, c) <= alike * (1 + 1e-9))
    assert sum(abs(a - b) for a, b in zip(got, even)) == moved


def _squares(weights, counts) -> float:
    out, start = 0.0, 0
    for c in counts:
        out += sum(weights[start : start + c]) ** 2
        start += c
    return out


@pytest.mark.parametrize("units, stages", [(10, 4), (7, 3), (6, 6), (9, 2), (1, 1)])
def test_alike_units_split_as_evenly_as_before(units, stages):
    assert list(balanced_counts((2.5,) * units, stages)) == even_counts(units, stages)


def _units(*overrides):
    cfg = config.load("llama_tiny_1f1b_2cpu", list(overrides))
    return [len(r) for r in models.split_of(cfg, resolve_schedule(cfg).num_stages)]


def test_llama_tiny_v_stages_take_a_block_more_at_the_ends():
    """llama-tiny's head weighs a third of a block and its embedding nothing: ZB-V's first and
    last stages (both on rank 0) take one block each beside them, as the bench measured best
    (ZB-V 1.00x of 1F1B's step against 1.15x split by units); 1F1B at p=2 stays as it was."""
    unit = llama_weights("llama-tiny")
    assert unit[0] == 0 and unit[-1] == pytest.approx(unit[1] / 3, rel=0.05)
    assert _units("pipeline.schedule=zbv", "model.layers=8") == [3, 2, 2, 3]
    assert _units("pipeline.schedule=zbv", "model.layers=8", "pipeline.balance=units") == [3, 3, 2, 2]
    assert _units("model.layers=8") == [5, 5] == _units("model.layers=8", "pipeline.balance=units")
    assert _units("pipeline.stages=4") == [2, 1, 1, 2]
    assert _units("pipeline.stages=4", "pipeline.layers_per_stage=[1,2,2,1]") == [1, 2, 2, 1]  # explicit wins


def llama_weights(preset: str) -> list[float]:
    cfg = config.load("llama_tiny_1f1b_2cpu", [f"model.preset={preset}"])
    return list(models.split_weights(cfg.model, "flops"))


def test_llama_unit_flops_follow_the_shapes():
    """A block's matmuls and causal attention per token, and the head's vocabulary matmul:
    llama-1b's head weighs about 4 blocks, llama-8b's about 2.4 (seq_len 2048)."""
    for preset, ratio in (("llama-1b", 4.04), ("llama-8b", 2.33)):
        w = llama_weights(preset)
        assert w[-1] / w[1] == pytest.approx(ratio, rel=0.01)
    cfg = config.load("llama_tiny_1f1b_2cpu", [])
    h, kv, ffn, seq = 64, 32, 192, 32
    assert models.split_weights(cfg.model, "flops")[1] == 2 * (2 * h * h + 2 * h * kv + 3 * h * ffn) + 2 * seq * h


def test_other_kinds_split_evenly_and_a_bad_balance_is_refused():
    cfg = config.load("transformer_1f1b_2cpu", ["pipeline.stages=3", "model.layers=7"])
    assert models.split_weights(cfg.model, "flops") is None
    assert [len(r) for r in models.split_of(cfg, 3)] == [3, 2, 2]
    with pytest.raises(UserError, match="pipeline.balance"):
        config.load("llama_tiny_1f1b_2cpu", ["pipeline.balance=even"])


def test_a_run_from_before_the_key_reads_back_split_as_it_ran(tmp_path):
    """A run's config.yaml written before pipeline.balance existed split llama's units evenly:
    read back (a plan from that run), it says units, so the plan regroups the stages it ran;
    one written now keeps its own."""
    cfg = config.load("llama_tiny_1f1b_2cpu", ["pipeline.stages=4"])
    text = config.to_yaml(cfg)
    (tmp_path / "now.yaml").write_text(text)
    (tmp_path / "before.yaml").write_text(text.replace("  balance: flops\n", ""))
    assert "balance" not in (tmp_path / "before.yaml").read_text()
    before, now = config.from_yaml(tmp_path / "before.yaml"), config.from_yaml(tmp_path / "now.yaml")
    assert before.pipeline.balance == "units" and now == cfg
    assert [len(r) for r in models.split_of(before, 4)] == [2, 2, 1, 1]
    assert [len(r) for r in models.split_of(now, 4)] == [2, 1, 1, 2]


def test_a_plans_command_keeps_the_runs_even_split(tmp_path):
    """From a run that split llama's units evenly (pipeline.balance=units, or a config.yaml from
    before the key), a plan's command says so: run on that config.yaml as it stands, it would
    split by FLOPs, not as the plan costed it. A run of the default needs nothing."""
    from ppx.plan.evaluate import Result
    from ppx.plan.howto import from_run_overrides
    from ppx.plan.inputs import PlanInputs

    inputs = PlanInputs(fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.0), wgrad_s=(0.5, 0.5), stages=2)
    best = Result("1f1b", 4, 4, 1, 1.0, 0.0, (0.0,) * 4, True)
    units = config.load("llama_tiny_1f1b_2cpu", ["pipeline.balance=units"])
    assert "pipeline.balance=units" in from_run_overrides(best, units, inputs)
    flops = config.load("llama_tiny_1f1b_2cpu", [])
    assert not any(o.startswith("pipeline.balance") for o in from_run_overrides(best, flops, inputs))
    other = config.load("transformer_1f1b_2cpu", ["pipeline.balance=units"])  # splits evenly either way
    assert not any(o.startswith("pipeline.balance") for o in from_run_overrides(best, other, inputs))
