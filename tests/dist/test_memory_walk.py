"""Every schedule with a backward, on the MLP at p = 2 (two stages a rank where the schedule
takes several): each rank's peak saved bytes, measured by the memory counters around the
runtime's actions (real gloo processes), equal the memory model's walk of the schedule from
the bytes one microbatch saved per stage (`ppx.measure.prediction.memory_prediction`, what
`ppx run` reports next to the measured peak). The MLP's layers each save their own
activations, so the walk is exact. So it is on a model whose units end with an activation
that keeps its output (Linear + Tanh, `helpers.own_shapes.widths`): at a V's turn the next
stage on the rank saves that output as its Linear's input, and the rank holds it once
(`peak_held`'s ``shared``). One process group runs every schedule; `ppx run`'s own
report of the same figures is checked on the transformer and llama in
tests/e2e/test_memory_prediction.py and at p = 4 in tests/e2e/test_instrumentation.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import free_port
from helpers.spawn import gloo_group, spawn
from ppx import config
from ppx.config import resolve_schedule
from ppx.engine.comm import P2P
from ppx.engine.rank import build_rank
from ppx.measure.instruments import Instruments
from ppx.measure.prediction import memory_prediction
from ppx.schedules.registry import FAMILIES, default_virtual

P = 2
EVERY = [name for name in FAMILIES if name != "forward_only"]  # forward_only saves nothing to free


MODELS = {
    "mlp": ["model.kind=mlp", "model.hidden=32", "model.layers=4"],
    # 4 units, Linear + Tanh but the last: each stage's output is saved by its Tanh and the next one's Linear
    "activations_at_the_cuts": [
        "model.kind=module",
        "model.module=helpers.own_shapes:widths",
        "model.data=regression",
        "model.hidden=16",
    ],
}


# the V schedules' turn under each way of a split backward, as well as auto's: a stage that stores
# keeps the shared tensor to its W; one that keeps its graph runs its first forward on a copy of
# its input (`StageRunner._call`, where auto's trial forward ran first), so that microbatch shares
# nothing and the walk, counting it twice, errs high by it, never low
WAYS = [(n, w) for n in ("zbv", "dualpipev") for w in ("store", "graph")]
CASES = [(m, n, "auto") for m in MODELS for n in EVERY] + [("activations_at_the_cuts", n, w) for n, w in WAYS]


def overrides(name: str, model: str, way: str = "auto") -> list[str]:
    """``model`` at p=2 under ``name``, with its default stages per rank (4 units: one a stage
    at v=2)."""
    m = 2 * P if name == "dualpipev" else 4  # DualPipeV needs m >= 2p
    return [
        *MODELS[model],
        f"train.split_backward={way}",
        f"pipeline.schedule={name}",
        f"pipeline.stages={P}",
        f"pipeline.microbatches={m}",
        "train.batch_size=8",
    ]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with gloo_group(rank, world, port):
        for model, name, way in CASES:
            cfg = config.load(None, overrides(name, model, way))
            schedule = resolve_schedule(cfg)
            pipe = build_rank(cfg, schedule, rank, "cpu", P2P.for_backend("gloo"))
            inst = Instruments(cfg, pipe, torch.device("cpu"))
            pipe.observers.extend(inst.observers)
            inst.begin_step(0)
            pipe.step(0)
            record, _ = inst.end_step(0)
            ranks = [None] * world
            dist.all_gather_object(ranks, {"rank": rank, **record})
            if rank == 0:
                predicted = memory_prediction([{"ranks": ranks}], schedule, ranks)
                torch.save({"ranks": ranks, "predicted": predicted}, Path(out) / f"{model}-{name}-{way}.pt")


@pytest.fixture(scope="module")
def walked(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("memory_walk")
    spawn(_worker, (P, free_port(), str(out)), P)
    return out


@pytest.mark.parametrize(("model", "name", "way"), CASES)
def test_the_walk_predicts_each_ranks_measured_peak(walked, name, model, way):
    got = torch.load(walked / f"{model}-{name}-{way}.pt")
    ranks, predicted = got["ranks"], got["predicted"]
    assert predicted, "the counters measured saved bytes"
    assert len(predicted["saved_bytes_per_microbatch"]) == default_virtual(name) * P
    for r in ranks:
        assert r["peak_activation_bytes"] > 0, (name, r)
        if way == "graph":  # (the copy: above)
            assert predicted["predicted_peak_activation_bytes"][r["rank"]] >= r["peak_activation_bytes"], (name, r)
        else:
            assert predicted["predicted_peak_activation_bytes"][r["rank"]] == r["peak_activation_bytes"], (name, r)
    assert predicted["memory_prediction_error"] == 0 or way == "graph"
