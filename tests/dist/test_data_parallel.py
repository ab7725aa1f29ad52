"""Pipeline x data parallel (``parallel.data`` = 2 replicas of a 2-rank pipeline, 4 gloo
processes): after one step every stage's gradients, reduced across the replicas by torch's
replicate or FSDP2 fully_shard, and the replicas' mean loss equal a single-process reference
on the whole global batch, for schedules with a full backward, a split one (the reduction
after the W's), two stages per rank and a V placement with overlapped cells, and with
recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_gradients import reference

from helpers import free_port
from helpers.spawn import gloo_group, spawn
from ppx import config
from ppx.config import resolve_schedule
from ppx.engine.data_parallel import Layout
from ppx.engine.loop import build_share

P, D = 2, 2
MLP = ["model.kind=mlp", "model.hidden=32"]
TRANSFORMER = ["model.kind=transformer", "model.hidden=32", "model.heads=2", "model.seq_len=8", "model.vocab_size=64"]
SCHEDULES = {  # name -> overrides beside the model's
    "1f1b": ["pipeline.schedule=1f1b", "model.layers=4"],
    "zb_h1": ["pipeline.schedule=zb_h1", "model.layers=4"],
    "interleaved": ["pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2", "model.layers=4"],
    "dualpipev": ["pipeline.schedule=dualpipev", "model.layers=4"],
}
CASES = {
    f"{model}-{sched}-{how}": [
        *(MLP if model == "mlp" else TRANSFORMER),
        *extra,
        f"pipeline.stages={P}",
        "pipeline.microbatches=4",
        "train.batch_size=16",
        "train.seed=5",
        f"parallel.data={D}",
        f"parallel.data_shard={how == 'shard'}",
    ]
    for model, scheds in (("mlp", SCHEDULES), ("transformer", ("1f1b", "zb_h1")))
    for sched, extra in ((s, SCHEDULES[s]) for s in scheds)
    for how in ("replicate", "shard")
}
# recomputation re-runs a stage's forward (its FSDP hooks included) inside its backward
CASES["transformer-zb_h1-shard-recompute_full"] = [*CASES["transformer-zb_h1-shard"], "train.recompute=full"]
CASES["mlp-1f1b-replicate-recompute_selective"] = [*CASES["mlp-1f1b-replicate"], "train.recompute=selective"]
# llama: the embedding alone on stage 0 (units [embedding, 4 blocks, head] split 1,5), and sharded
LLAMA = ["model.kind=llama", "model.hidden=32", "model.heads=4", "model.kv_heads=2", "model.seq_len=8",
         "model.vocab_size=64"]  # fmt: skip
for _how in ("replicate", "shard"):
    CASES[f"llama-1f1b-{_how}-embedding_alone"] = [
        *LLAMA, *CASES[f"transformer-1f1b-{_how}"][len(TRANSFORMER):], "pipeline.layers_per_stage=[1,5]"
    ]  # fmt: skip


# bf16: FSDP2's policy sums each microbatch's gradient into fp32; a split backward's W adds its
# own outside autograd, and W's in a row (ZB-H1's drain) must join that sum one by one, as a whole
# backward's do: every schedule's gradients then equal to the bit (held against each other)
BF16 = {
    f"transformer-{sched}-{how}-bf16": [*CASES[f"transformer-{base}-{how}"], "train.dtype=bf16", *extra]
    for sched, base, extra in (
        ("1f1b", "1f1b", []),
        ("zb_h1_store", "zb_h1", ["train.split_backward=store"]),
        ("zb_h1_graph", "zb_h1", ["train.split_backward=graph"]),
    )
    for how in ("replicate", "shard")
}
CASES |= BF16


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with gloo_group(rank, world, port):
        for name, o in CASES.items():
            cfg = config.load(None, o)
            layout = Layout(P, D, rank)
            pipe = build_share(cfg, resolve_schedule(cfg), layout, torch.device("cpu"), "gloo", [])
            loss = pipe.step(0)
            grads = {
                stage: [None if q.grad is None else q.grad.to_local().clone() for q in mod.parameters()]
                for stage, mod in pipe.modules.items()
            }
            torch.save({"loss": loss, "grads": grads}, Path(out) / f"{name}.rank{rank}.pt")
            dist.barrier()


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    out = tmp_path_factory.mktemp("grads_dp")
    spawn(_worker, (P * D, free_port(), str(out)), P * D)
    return out


@pytest.mark.parametrize("how", ["replicate", "shard"])
def test_in_bf16_a_split_backward_sums_its_replicas_gradients_as_a_whole_one_does(replicated, how):
    runs = {
        name: [torch.load(replicated / f"{name}.rank{r}.pt") for r in range(P * D)]
        for name in BF16
        if f"-{how}-" in name
    }
    (whole, *split) = runs.values()
    for parts in split:
        assert [x["loss"] for x in parts] == [x["loss"] for x in whole]
        for mine, theirs in zip(parts, whole):
            for s, grads in theirs["grads"].items():
                assert all(torch.equal(a, b) for a, b in zip(mine["grads"][s], grads))


@pytest.mark.parametrize("name", [n for n in CASES if n not in BF16])
def test_replicas_gradients_equal_single_process_reference(replicated, name):
    o = CASES[name]
    ref_loss, ref_grads = reference([x for x in o if not x.startswith("parallel.")])
    parts = {r: torch.load(replicated / f"{name}.rank{r}.pt") for r in range(P * D)}
    losses = [x["loss"] for x in parts.values() if x["loss"] is not None]
    assert len(losses) == D, "each replica's last rank reports its share's loss"
    assert sum(losses) / D == pytest.approx(ref_loss, rel=1e-6)
    shard = "-shard" in name
    for dp in range(D):  # every replica holds the reduced gradients (sharded: its part of them)
        by_stage = {s: g for pp in range(P) for s, g in parts[Layout(P, D, 0).global_rank(pp, dp)]["grads"].items()}
        grads = [g for s in sorted(by_stage) for g in by_stage[s]]
        assert len(grads) == len(ref_grads)
        for k, (g, ref) in enumerate(zip(grads, ref_grads)):
            want = ref.chunk(D)[dp] if shard else ref  # FSDP2 shards dim 0 as torch.chunk does
            assert g is not None and g.shape == want.shape, f"replica {dp} param {k}"
            torch.testing.assert_close(
                g, want, rtol=1e-5, atol=1e-6, msg=lambda m, k=k, dp=dp: f"replica {dp} param {k}: {m}"
            )
