"""`ppx run` of the shipped llama experiments, and runtime.cpu_fallback applied and recorded
when a run falls back to CPU, under ppx's launcher and under torchrun (every rank agrees)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from helpers import ppx, read_json, torchrun_ppx


def test_llama_tiny_runs_end_to_end(tmp_path):
    d = tmp_path / "run"
    r = ppx("run", "llama_tiny_1f1b_2cpu", "train.steps=2", f"run.dir={d}")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_json(d / "summary.json")
    assert s["status"] == "completed" and s["stages"] == 2 and len(s["losses"]) == 2
    assert 0 < s["losses"][1] < s["losses"][0] < 6  # cross-entropy over 256 tokens starts near ln 256 = 5.5
    m = OmegaConf.load(d / "config.yaml").model
    assert (m.kind, m.preset, m.hidden, m.kv_heads) == ("llama", "llama-tiny", 64, 2)
    assert "cpu_fallback" not in r.stderr  # runtime.device=cpu: asked for, not a fallback


def test_cpu_fallback_is_applied_and_recorded(tmp_path):
    d = tmp_path / "run"
    r = ppx("run", "llama1b_1f1b_8gpu", "parallel.data=1", "train.steps=2", f"run.dir={d}")  # GPUs hidden
    assert r.returncode == 0, r.stderr[-3000:]
    notices = [line for line in r.stderr.splitlines() if "runtime.cpu_fallback" in line]
    assert len(notices) == 1 and "model.preset=llama-tiny" in notices[0] and "train.batch_size=16" in notices[0]
    assert "train.steps" not in notices[0]  # the command line's train.steps=2 holds: the line names what applies
    cfg = OmegaConf.load(d / "config.yaml")
    assert (cfg.model.preset, cfg.model.hidden, cfg.model.layers, cfg.model.vocab_size) == ("llama-tiny", 64, 4, 256)
    assert cfg.train.batch_size == 16  # the fallback's, over the experiment's 32
    assert cfg.train.steps == 2  # the command line's, over the fallback's 10
    s = read_json(d / "summary.json")
    assert s["status"] == "completed" and s["stages"] == 4 and s["steps"] == 2


def test_cpu_fallback_under_torchrun_changes_the_stage_count_on_every_rank(tmp_path):
    """Started by torchrun with 2 processes: the experiment asks for 4 stages, its CPU fallback
    for 2; every rank re-loads the same config, so the job runs, and rank 0 alone says so."""
    exp = tmp_path / "mine.yaml"
    exp.write_text(
        "pipeline: {schedule: 1f1b, stages: 4, microbatches: 4}\nmodel: {preset: llama-1b}\n"
        "train: {batch_size: 8, steps: 2}\n"
        "runtime: {cpu_fallback: [pipeline.stages=2, model.preset=llama-tiny]}\n"
    )
    args = ["run", str(exp), f"run.root={tmp_path / 'runs'}", "logging.wandb.mode=disabled", "logging.report=false"]
    r = torchrun_ppx(2, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    notices = [line for line in r.stderr.splitlines() if "runtime.cpu_fallback" in line]
    assert notices == ["ppx: on CPU, runtime.cpu_fallback applies: pipeline.stages=2 model.preset=llama-tiny"]
    (d,) = (tmp_path / "runs" / "mine").iterdir()
    cfg = OmegaConf.load(d / "config.yaml")
    assert (cfg.pipeline.stages, cfg.model.preset, cfg.model.hidden) == (2, "llama-tiny", 64)
    assert read_json(d / "summary.json")["status"] == "completed"


def test_llama_at_four_stages_runs_the_balanced_split_end_to_end(tmp_path):
    """A real llama-tiny run at p=4 (4 ranks on CPU, 1 step): summary.json's units_per_stage
    is the FLOPs split, 2, 1, 1, 2, and with pipeline.balance=units the even one; each stage's
    share of the forward FLOPs (the embedding none, the head 0.32 of a block) is in
    summary.json and the line that says the split."""
    block, head = 1 / 4.32, 0.32 / 4.32  # llama-tiny at seq 32: the head weighs 0.32 of a block
    for balance, want, shares, how in (
        ("flops", [2, 1, 1, 2], [block, block, block, block + head], "split by forward FLOPs"),
        ("units", [2, 2, 1, 1], [block, 2 * block, block, head], "split evenly"),
    ):
        d = tmp_path / balance
        r = ppx("run", "llama_tiny_1f1b_2cpu", "pipeline.stages=4", "train.steps=1", f"pipeline.balance={balance}",
                f"run.dir={d}")  # fmt: skip
        assert r.returncode == 0, r.stderr
        s = read_json(d / "summary.json")
        assert s["units_per_stage"] == want
        assert s["flops_share_per_stage"] == pytest.approx(shares, rel=1e-9)
        said = f"ppx: units per stage {', '.join(map(str, want))} ({how}, pipeline.balance={balance}); "
        assert said in r.stdout
