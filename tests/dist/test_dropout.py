"""Dropout the same way whatever the schedule: a model with dropout (a user's module by import
path, and GPT-2 with its three dropouts), one pipelined step on real gloo processes under
several schedules, stage counts, a split backward, recomputation (full: the forward re-run in
the backward; selective: its element-wise ops, dropout among them, re-run) and torch's
executor, gives the loss and every parameter's gradient of one process running the
microbatches in turn with each microbatch's masks (`ppx.models.seeding`: keyed by seed, step,
replica, microbatch and unit). Before the masks were keyed, each process drew from its own
unseeded generator, so no two runs, and no recomputation, drew the same masks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import REPO, free_port
from helpers.spawn import gloo_group, spawn
from ppx import config, models
from ppx.config import resolve_schedule
from ppx.engine.data_parallel import Layout
from ppx.engine.loop import build_share
from ppx.engine.rank import build_reference
from ppx.models.seeding import microbatch, microbatch_key

pytest.importorskip("transformers")

MODULE = [
    "model.kind=module",
    "model.module=helpers.own_module:build",
    "model.batch_fn=helpers.own_module:batch",
    "model.loss_fn=helpers.own_module:loss",
    "model.args={width: 16, depth: 4, dropout: 0.3}",
]
GPT2 = [
    "model.kind=hf",
    "model.hf_config=gpt2",
    "model.hf_overrides={resid_pdrop: 0.2, embd_pdrop: 0.2, attn_pdrop: 0.2, tie_word_embeddings: false}",
    "model.hidden=32",
    "model.heads=4",
    "model.vocab_size=64",
    "model.seq_len=16",
    "model.layers=4",
]
COMMON = ["pipeline.microbatches=4", "train.batch_size=8", "train.seed=5"]
CASES = {
    f"{name}-{label}": model + COMMON + extra
    for name, model in (("module", MODULE), ("gpt2", GPT2))
    for label, extra in {
        "gpipe": ["pipeline.schedule=gpipe"],
        "zb_h1": ["pipeline.schedule=zb_h1"],
        "1f1b-recompute_full": ["pipeline.schedule=1f1b", "train.recompute=full"],
        "zb_h1-recompute_selective": ["pipeline.schedule=zb_h1", "train.recompute=selective"],
        "interleaved": ["pipeline.schedule=interleaved_1f1b"],
        "torch_executor": ["pipeline.schedule=1f1b", "pipeline.executor=torch"],
    }.items()
}


# torch's tracer split: its graph calls no unit's seeding, so a stage's first unit keys its
# masks: the same on every schedule and recomputation at one split (held against each other)
TRACER = {
    label: MODULE + COMMON + ["pipeline.split=tracer", *extra]
    for label, extra in {
        "tracer-1f1b": ["pipeline.schedule=1f1b"],
        "tracer-gpipe-recompute_full": ["pipeline.schedule=gpipe", "train.recompute=full"],
        "tracer-zb_h1": ["pipeline.schedule=zb_h1"],
    }.items()
}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import os

    os.chdir(REPO / "tests")  # helpers.own_module imports from tests/
    with gloo_group(rank, world, port):
        for name, o in (CASES | TRACER).items():
            cfg = config.load(None, [*o, "pipeline.stages=2"])
            pipe = build_share(cfg, resolve_schedule(cfg), Layout(2, 1, rank), torch.device("cpu"), "gloo", [])
            loss = pipe.step(0)
            grads = {n: q.grad.clone() for mod in pipe.modules.values() for n, q in mod.named_parameters()}
            torch.save({"loss": loss, "grads": grads}, Path(out) / f"{name}.rank{rank}.pt")
            dist.barrier()


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory):
    out = tmp_path_factory.mktemp("dropout")
    spawn(_worker, (2, free_port(), str(out)), 2)
    return out


def one_process(o: list[str], keyed: bool = True):
    """Loss and gradients by name of the whole model in one process, its microbatches in turn,
    each under its key (``keyed``: else with the generator as it stands)."""
    cfg = config.load(None, [x for x in o if not x.startswith("pipeline.") or "microbatches" in x])
    model, kind = build_reference(cfg), models.kind(cfg.model.kind)
    x, y = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    m, total = cfg.pipeline.microbatches, 0.0
    for k, (xk, yk) in enumerate(zip(x.chunk(m), y.chunk(m))):
        with microbatch(microbatch_key(cfg.train.seed, 0, 0, k) if keyed else None):
            loss = kind.loss(model(xk), yk) / m
        loss.backward()
        total += loss.item()
    return total, {n: q.grad for n, q in model.named_parameters()}


@pytest.mark.parametrize("name", list(CASES))
def test_dropout_masks_are_the_microbatchs_whatever_runs_it(pipelined, monkeypatch, name):
    monkeypatch.chdir(REPO / "tests")
    parts = [torch.load(pipelined / f"{name}.rank{r}.pt") for r in range(2)]
    want_loss, want = one_process(CASES[name])
    (loss,) = [x["loss"] for x in parts if x["loss"] is not None]
    assert loss == pytest.approx(want_loss, rel=1e-6)
    grads = {n: g for x in parts for n, g in x["grads"].items()}
    assert set(grads) == set(want)
    for n, g in grads.items():
        torch.testing.assert_close(g, want[n], rtol=1e-5, atol=1e-6, msg=lambda s, n=n: f"{n}: {s}")


@pytest.mark.parametrize("model", ["module", "gpt2"])
def test_the_masks_are_drawn(monkeypatch, model):
    """Dropout acts (the test above could not fail without it): the keyed loss is another than
    the same model's with other masks."""
    monkeypatch.chdir(REPO / "tests")
    o = CASES[f"{model}-gpipe"]
    keyed, _ = one_process(o)
    torch.manual_seed(123)
    assert one_process(o, keyed=False)[0] != pytest.approx(keyed, rel=1e-6)
    assert one_process(o)[0] == keyed


def test_under_the_tracer_a_stage_draws_the_same_masks_on_every_schedule_and_recomputation(pipelined):
    runs = {name: [torch.load(pipelined / f"{name}.rank{r}.pt") for r in range(2)] for name in TRACER}
    losses = {name: next(x["loss"] for x in parts if x["loss"] is not None) for name, parts in runs.items()}
    assert len(set(losses.values())) == 1, losses
    grads = {name: {n: g for x in parts for n, g in x["grads"].items()} for name, parts in runs.items()}
    first, *others = grads.values()
    for other in others:
        for n, g in first.items():
            torch.testing.assert_close(other[n], g, rtol=1e-6, atol=1e-7, msg=lambda s, n=n: f"{n}: {s}")
    # and dropout acts there: without keys, two runs of one config draw apart
    assert losses["tracer-1f1b"] != pytest.approx(one_process(TRACER["tracer-1f1b"], keyed=False)[0], rel=1e-6)
