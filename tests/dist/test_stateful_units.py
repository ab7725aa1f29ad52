"""Units whose forward moves buffers (a running mean the output is normalised by, BatchNorm's
running statistics, a call counter): after one pipelined step on gloo processes, the loss,
every gradient and every buffer are one process's running the microbatches in turn, under a
split backward's trial forward (zb_h1, zbv: the trial had moved each buffer by one sample
microbatch more) and under train.recompute (the recomputation had run on buffers later
microbatches had moved, and moved them again)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import free_port
from helpers.spawn import gloo_group, spawn
from ppx import config, models
from ppx.config import resolve_schedule
from ppx.engine.data_parallel import Layout
from ppx.engine.loop import build_share
from ppx.engine.rank import build_reference

M = 4


def keys(schedule: str, *extra: str) -> list[str]:
    return [
        "model.kind=module",
        "model.module=helpers.own_stateful:stateful",
        "model.data=regression",
        "model.hidden=8",
        f"pipeline.schedule={schedule}",
        "pipeline.stages=2",
        f"pipeline.microbatches={M}",
        "train.batch_size=16",
        "train.seed=5",
        *extra,
    ]


CASES = {
    "1f1b": keys("1f1b"),
    "zb_h1": keys("zb_h1"),
    "zbv": keys("zbv", "pipeline.microbatches=4"),
    "1f1b-recompute_full": keys("1f1b", "train.recompute=full"),
    "zb_h1-recompute_full": keys("zb_h1", "train.recompute=full"),
    "gpipe-recompute_selective": keys("gpipe", "train.recompute=selective"),
    # torch.distributed.pipelining's executor: its shape inference's forward (uninitialised
    # tensors past stage 0) moved the buffers
    "torch_gpipe": keys("torch_gpipe"),
    "1f1b-executor_torch": keys("1f1b", "pipeline.executor=torch"),
}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with gloo_group(rank, world, port):
        for name, o in CASES.items():
            cfg = config.load(None, o)
            pipe = build_share(cfg, resolve_schedule(cfg), Layout(2, 1, rank), torch.device("cpu"), "gloo", [])
            loss = pipe.step(0)
            got = {
                "loss": loss,
                "grads": {n: q.grad.clone() for mod in pipe.modules.values() for n, q in mod.named_parameters()},
                "buffers": {n: b.clone() for mod in pipe.modules.values() for n, b in mod.named_buffers()},
            }
            torch.save(got, Path(out) / f"{name}.rank{rank}.pt")


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stateful")
    spawn(_worker, (2, free_port(), str(out)), 2)
    return out


def in_turn(o: list[str]) -> tuple[float, dict, dict]:
    """Loss, gradients and buffers of the unsplit model running the microbatches in turn."""
    cfg = config.load(None, [x for x in o if not x.startswith(("pipeline.", "train.recompute"))])
    model = build_reference(cfg)
    kind = models.kind(cfg.model.kind)
    x, y = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    total = 0.0
    for xm, ym in zip(x.chunk(M), y.chunk(M)):
        loss = kind.loss(model(xm), ym) / M
        loss.backward()
        total += loss.item()
    return total, {n: q.grad for n, q in model.named_parameters()}, dict(model.named_buffers())


@pytest.mark.parametrize("name", list(CASES))
def test_buffers_loss_and_gradients_are_one_process_running_the_microbatches_in_turn(pipelined, name):
    parts = [torch.load(pipelined / f"{name}.rank{r}.pt") for r in range(2)]
    loss, grads, buffers = in_turn(CASES[name])
    assert next(p["loss"] for p in parts if p["loss"] is not None) == pytest.approx(loss, rel=1e-6)
    got = {n: g for p in parts for n, g in p["grads"].items()}
    assert got.keys() == grads.keys()
    for n, g in got.items():
        torch.testing.assert_close(g, grads[n], rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    held = {n: b for p in parts for n, b in p["buffers"].items()}
    assert held.keys() == buffers.keys()
    for n, b in held.items():
        torch.testing.assert_close(b, buffers[n], rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"buffer {n}: {m}")
    assert {n: int(b) for n, b in held.items() if n.endswith(("calls", "num_batches_tracked"))} == {
        n: M for n in held if n.endswith(("calls", "num_batches_tracked"))
    }
