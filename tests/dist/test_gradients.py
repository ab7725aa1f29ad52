"""Every schedule, p in {2, 4}, the three models (llama's embedding and head split as units of
their own), and torch 2.13's own orders at p in {2, 4, 8}: after one pipelined step each
parameter's gradient and the loss equal a single-process full-batch reference (real gloo
processes)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import free_port
from helpers.spawn import gloo_group, spawn
from ppx import config, models
from ppx.config import resolve_schedule
from ppx.engine.comm import P2P
from ppx.engine.rank import build_rank, build_reference
from ppx.engine.torch_executor import TorchPipeline

MODELS = {
    "mlp": ["model.kind=mlp", "model.hidden=32", "model.layers=4"],
    "transformer": [
        "model.kind=transformer",
        "model.hidden=32",
        "model.layers=4",
        "model.heads=2",
        "model.seq_len=8",
        "model.vocab_size=64",
    ],
    "llama": [
        "model.kind=llama",
        "model.hidden=32",
        "model.layers=4",
        "model.heads=4",
        "model.kv_heads=2",
        "model.seq_len=8",
        "model.vocab_size=64",
    ],
}
SCHEDULES = {  # name -> (schedule, microbatches)
    "naive_m1": ("naive", 1),
    "naive_m4": ("naive", 4),
    "gpipe": ("gpipe", 4),
    "1f1b": ("1f1b", 4),
    "1f1b_m2": ("1f1b", 2),
    "forward_only": ("forward_only", 4),
    "interleaved": ("interleaved_1f1b", 4),
    "zb_h1": ("zb_h1", 4),
    "zb_h2": ("zb_h2", 8),
    "looped_bfs": ("looped_bfs", 4),
    "interleaved_zb": ("interleaved_zb", 4),
    "zbv": ("zbv", 8),
    "dualpipev": ("dualpipev", 8),  # V placements; dualpipev needs m >= 2p
}
UNEVEN = {4: "[1,1,1,1]", 2: "[3,1]"}
# llama on one schedule per way of running a stage: full backward, split I/W, two stages per
# rank, a V placement, overlapped cells (the others run the same runtime paths on mlp and transformer)
LLAMA_SCHEDULES = ("1f1b", "zb_h1", "interleaved", "zbv", "dualpipev")
UNEVEN_UNITS = {4: "[1,2,2,1]", 2: "[5,1]"}  # llama's [embedding, 4 blocks, head]: embedding or head alone


def overrides(model: str, sched: str, p: int, uneven: bool = False) -> list[str]:
    name, m = SCHEDULES[sched]
    o = MODELS[model] + [
        f"pipeline.schedule={name}",
        f"pipeline.stages={p}",
        f"pipeline.microbatches={m}",
        "train.batch_size=8",
        "train.seed=3",
    ]
    if name in (
        "interleaved_1f1b",
        "looped_bfs",
        "interleaved_zb",
        "zbv",
        "dualpipev",
    ):  # two stages per rank: 2p stages need 2p layers
        o += ["pipeline.virtual_stages=2", f"model.layers={2 * p}"]
    split = UNEVEN_UNITS[p] if model == "llama" else UNEVEN[p]
    return o + ([f"pipeline.layers_per_stage={split}"] if uneven else [])


@functools.cache  # (its CSVs written once a process; every test reads it)
def cases(p: int) -> list[tuple[str, list[str]]]:
    """(model-schedule-split[-variant], overrides) per case; the name is the same for every p.
    split: "even" (the layer split, equal stages), "uneven" (pipeline.layers_per_stage),
    "tracer" (torch's tracer cuts one traced nn.Module into GraphModules) or "tracer-uneven".
    At p = 8 only torch's orders run (eight processes on a CI machine's two cores)."""
    if p == 8:
        return torch_order_cases(p)
    out = [
        (f"{mo}-{s}-even", overrides(mo, s, p))
        for mo in MODELS
        for s in SCHEDULES
        if mo != "llama" or s in LLAMA_SCHEDULES
    ]
    out += [(f"{mo}-1f1b-uneven", overrides(mo, "1f1b", p, uneven=True)) for mo in MODELS]
    out += [
        ("mlp-1f1b-tracer-uneven", overrides("mlp", "1f1b", p, uneven=True) + ["pipeline.split=tracer"]),
        ("transformer-zb_h1-tracer", overrides("transformer", "zb_h1", p) + ["pipeline.split=tracer"]),
        ("mlp-interleaved-tracer", overrides("mlp", "interleaved", p) + ["pipeline.split=tracer"]),
        ("llama-1f1b-tracer-uneven", overrides("llama", "1f1b", p, uneven=True) + ["pipeline.split=tracer"]),
    ]
    # stores on every stage, the first too (auto runs ZB-H1's and ZB-V's first stage whole: each
    # of its I's is followed at once by its W)
    out += [
        (f"{mo}-{s}-even-store", overrides(mo, s, p) + ["train.split_backward=store"])
        for mo, s in [("llama", "zb_h1"), ("transformer", "zbv")]
    ]
    # store with the embedding alone on stage 0: that stage has no Linear to store and keeps its graph
    alone = {2: "[1,5]", 4: "[1,2,2,1]"}[p]
    out.append(
        (
            "llama-zb_h1-embedding-alone-store",
            overrides("llama", "zb_h1", p) + ["train.split_backward=store", f"pipeline.layers_per_stage={alone}"],
        )
    )
    # ZB-V with as many microbatches as ranks: its stage p runs whole too (its gradient stays on its rank)
    out.append(
        ("transformer-zbv-few-microbatches", overrides("transformer", "zbv", p) + [f"pipeline.microbatches={p}"])
    )
    # receives posted 0 (the lowered list's place) or 2 compute actions before their consumer
    # (default -1: all of them at the rank's first wait)
    out += [
        (f"{mo}-{s}-even-lookahead{k}", overrides(mo, s, p) + [f"runtime.recv_lookahead={k}"])
        for mo, s in [("mlp", "1f1b"), ("transformer", "interleaved"), ("mlp", "zb_h1")]
        for k in (0, 2)
    ]
    # ppx's lists exported to torch's CSV form and executed by torch's _PipelineScheduleRuntime
    out += [
        (f"{mo}-{s}-even-torch_executor", overrides(mo, s, p) + ["pipeline.executor=torch"])
        for mo, s in [("mlp", "1f1b"), ("mlp", "zb_h1"), ("transformer", "interleaved")]
    ]
    # ZB-H1 split only where its W comes after the stage's last F, the rest whole B's
    # (train.split_backward=drain): a split stage that also runs B's; as a CSV of that list,
    # storing on every stage (the first too) and the graph's way; recomputing; torch's executor
    drain = [o for o in overrides("llama", "zb_h1", p) if not o.startswith("pipeline.microbatches=")]
    drain += [f"pipeline.microbatches={2 * p}", "train.split_backward=drain"]  # (at m = p every W follows the last F)
    out += [
        ("llama-zb_h1-drain", drain),
        ("llama-zb_h1-drain-recompute", drain + ["train.recompute=full"]),
        ("llama-zb_h1-drain-torch_executor", drain + ["pipeline.executor=torch"]),
        ("llama-zb_h1-drain-csv-store", drain_csv_overrides("llama", p) + ["train.split_backward=store"]),
        ("transformer-zb_h1-drain-csv-graph", drain_csv_overrides("transformer", p) + ["train.split_backward=graph"]),
    ]
    # m = 5: 1/m inexact, which torch's runtime applied to the summed gradients (scale_grads), not
    # to each microbatch's loss, as ppx's does: they differed in the last bit
    five = overrides("transformer", "1f1b", p) + ["pipeline.microbatches=5", "train.batch_size=20"]
    out += [("transformer-1f1b-m5", five), ("transformer-1f1b-m5-torch_executor", five + ["pipeline.executor=torch"])]
    out.append(("mlp-zb_auto-csv", auto_csv_overrides(p)))
    # the memory-using orders: 2p microbatches with the paper's accounting (I frees 0.6), steady cost
    out.append(("mlp-zb_auto-2p-steady-csv", auto_csv_overrides(p, limit=2 * p, share=0.6, cost="steady")))
    return out + torch_order_cases(p)


def auto_csv_overrides(p: int, m: int = 8, limit: float = 2, share: float = 0.0, cost: str = "sync") -> list[str]:
    """Overrides running ppx's automatic schedule for unequal stages (the last 1.5x slower,
    its W cheaper) under a limit (default tight: two microbatches per rank; ``share``: what
    an I frees; ``cost``: what it minimises), placed for NCCL and written to a CSV
    (atomically: every spawned process writes the same file)."""
    import os
    import tempfile

    from ppx.schedules.auto.auto_zb import auto_zb
    from ppx.schedules.csv_io import write_csv
    from ppx.schedules.placing.placement import place_comms
    from ppx.schedules.sim.costs import Costs

    path = Path(tempfile.gettempdir()) / f"ppx-zb-auto-{os.getuid()}" / f"p{p}_m{m}_{limit:g}_{share:g}_{cost}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    slow = [1.0] * (p - 1) + [1.5]
    costs = Costs(slow, slow, [0.5] * p, p2p=0.05)
    write_csv(place_comms(auto_zb(p, m, costs, mem_limit=limit, input_share=share, cost=cost), "nccl"), tmp)
    os.replace(tmp, path)
    return MODELS["mlp"] + [
        f"pipeline.schedule={path}",
        f"pipeline.stages={p}",
        f"pipeline.microbatches={m}",
        "train.batch_size=8",
        "train.seed=3",
    ]


def drain_csv_overrides(model: str, p: int) -> list[str]:
    """Overrides running ZB-H1 whose every microbatch's backward is whole (B) except where its
    W comes after the stage's last F (`drain_only`), from a CSV (atomically: every spawned
    process writes the same file)."""
    import os
    import tempfile

    from ppx import schedules
    from ppx.schedules.csv_io import write_csv
    from ppx.schedules.ir.structure import drain_only

    m = 2 * p  # (at m = p every W comes after the last F)
    path = Path(tempfile.gettempdir()) / f"ppx-zb-drain-{os.getuid()}" / f"p{p}_m{m}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    write_csv(drain_only(schedules.build("zb_h1", p, m)), tmp)
    os.replace(tmp, path)
    keep = [
        o for o in overrides(model, "zb_h1", p) if not o.startswith(("pipeline.schedule=", "pipeline.microbatches="))
    ]
    return keep + [f"pipeline.schedule={path}", f"pipeline.microbatches={m}"]


def torch_order_cases(p: int) -> list[tuple[str, list[str]]]:
    """torch 2.13's own orders, built from the installed torch and given as compute-only CSVs:
    ppx places their sends and receives (V placements, overlapped cells included); m in
    {p, 2p, 4p} where torch builds the order (DualPipeV: m >= 2p); at p = 8, m in {p, 2p}
    (m = 4p, 32 microbatches on eight processes, runs at p = 2 and 4)."""
    ks = (1, 2) if p == 8 else (1, 2, 4)
    return [
        (f"mlp-torch_{cls}-m{k}p-csv", torch_csv_overrides(cls, p, k * p))
        for cls in TORCH_ORDERS
        for k in ks
        if not (cls == "ScheduleDualPipeV" and k == 1)
    ]


# torch's schedule classes whose orders run (Schedule1F1B's order is refused: its last rank
# runs a backward before its forward, tests/unit/test_placement.py) -> stages per rank
TORCH_ORDERS = {
    "ScheduleGPipe": 1,
    "ScheduleInterleaved1F1B": 2,
    "ScheduleLoopedBFS": 2,
    "ScheduleInterleavedZeroBubble": 2,
    "ScheduleZBVZeroBubble": 2,
    "ScheduleDualPipeV": 2,
}


def torch_csv_overrides(cls: str, p: int, m: int) -> list[str]:
    """Overrides running torch's ``cls`` order for p ranks from a CSV written once per torch
    version (atomically: every spawned process writes the same file)."""
    import os
    import tempfile

    from helpers.torch_orders import torch_order
    from ppx.schedules.csv_io import write_csv

    v = TORCH_ORDERS[cls]
    path = Path(tempfile.gettempdir()) / f"ppx-torch-orders-{torch.__version__}" / f"{cls}_p{p}_m{m}.csv"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        write_csv(torch_order(cls, p, m, v), tmp)
        os.replace(tmp, path)
    return MODELS["mlp"][:-1] + [
        f"model.layers={v * p}",
        f"pipeline.schedule={path}",
        f"pipeline.stages={p}",
        f"pipeline.microbatches={m}",
        f"train.batch_size={4 * p}",
        "train.seed=3",
    ]


STAGE_COUNTS = (2, 4, 8)
CASES = [(p, name) for p in STAGE_COUNTS for name, _ in cases(p)]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with gloo_group(rank, world, port):
        for name, o in cases(world):
            cfg = config.load(None, o)
            if cfg.pipeline.executor == "torch":
                pipe = TorchPipeline(cfg, resolve_schedule(cfg), rank, "cpu")
            else:
                pipe = build_rank(cfg, resolve_schedule(cfg), rank, "cpu", P2P.for_backend("gloo"))
            loss = pipe.step(0)
            grads = {
                stage: [None if q.grad is None else q.grad.clone() for q in mod.parameters()]
                for stage, mod in pipe.modules.items()
            }
            torch.save({"loss": loss, "grads": grads}, Path(out) / f"{name}.rank{rank}.pt")
            dist.barrier()


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory):
    """p -> the folder of every case's saved loss and gradients for p ranks: one job per
    p (one process group runs all of its cases), started by the first test that needs it."""
    done: dict[int, Path | BaseException] = {}

    def get(p: int) -> Path:
        if p not in done:
            out = tmp_path_factory.mktemp(f"grads_p{p}")
            try:
                spawn(_worker, (p, free_port(), str(out)), p)
                done[p] = out
            except Exception as e:  # every case of this p fails with it, without spawning again
                done[p] = e
        if isinstance(done[p], BaseException):
            raise RuntimeError(f"the {p}-rank job failed") from done[p]
        return done[p]

    return get


def reference(o: list[str]):
    return _reference(tuple(x for x in o if not x.startswith("pipeline.")))  # one process, one stage


@functools.cache  # (the cases of one model share it: only their pipeline keys differ)
def _reference(o: tuple[str, ...]):
    cfg = config.load(None, list(o))
    model = build_reference(cfg)
    kind = models.kind(cfg.model.kind)
    x, y = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    loss = kind.loss(model(x), y)
    loss.backward()
    return loss.item(), [q.grad for q in model.parameters()]


@pytest.mark.parametrize("p,name", CASES, ids=[f"p{p}-{name}" for p, name in CASES])
def test_gradients_equal_single_process_reference(pipelined, p, name):
    out = pipelined(p)
    ref_loss, ref_grads = reference(dict(cases(p))[name])
    parts = [torch.load(out / f"{name}.rank{r}.pt") for r in range(p)]
    losses = [x["loss"] for x in parts if x["loss"] is not None]
    assert len(losses) == 1, "exactly the last rank reports the loss"
    assert losses[0] == pytest.approx(ref_loss, rel=1e-6)
    by_stage = {stage: g for x in parts for stage, g in x["grads"].items()}  # interleaved: 2 per rank
    grads = [g for stage in sorted(by_stage) for g in by_stage[stage]]
    assert len(grads) == len(ref_grads), "parameters split over ranks must add up to the model"
    for k, (g, ref) in enumerate(zip(grads, ref_grads)):
        if "forward_only" in name:
            assert g is None, f"param {k}: forward-only computes no gradients"
            continue
        assert g is not None and g.shape == ref.shape, f"param {k}"
        torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"param {k}: {m}")


# schedules run on the same model, split and microbatches: every stage adds its microbatches'
# gradients in microbatch order, so they agree to the bit (looped_bfs, in torch's order, did not)
SAME_WORK = [
    ("naive_m4", "gpipe", "1f1b", "zb_h1"),
    ("interleaved", "looped_bfs", "interleaved_zb"),
    ("zbv", "dualpipev"),
]


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("model", list(MODELS))
def test_schedules_of_the_same_work_give_the_same_bits(pipelined, p, model):
    out = pipelined(p)
    compared = 0
    for group in SAME_WORK:
        names = [f"{model}-{s}-even" for s in group if model != "llama" or s in LLAMA_SCHEDULES]
        results = []
        for name in names:
            parts = [torch.load(out / f"{name}.rank{r}.pt") for r in range(p)]
            by_stage = {stage: g for x in parts for stage, g in x["grads"].items()}
            loss = next(x["loss"] for x in parts if x["loss"] is not None)
            results.append((name, loss, [g for stage in sorted(by_stage) for g in by_stage[stage]]))
        (first, loss0, grads0), *rest = results
        for name, loss, grads in rest:
            assert loss == loss0, f"{name} against {first}: loss {loss} != {loss0}"
            differ = [k for k, (a, b) in enumerate(zip(grads, grads0)) if not torch.equal(a, b)]
            assert differ == [], f"{name} against {first}: parameters {differ} differ in their bits"
            compared += 1
    assert compared


@pytest.mark.parametrize("p", [2, 4])
def test_torchs_runtime_gives_ppxs_bits_where_one_over_m_is_inexact(pipelined, p):
    out = pipelined(p)
    runs = []
    for name in ("transformer-1f1b-m5", "transformer-1f1b-m5-torch_executor"):
        parts = [torch.load(out / f"{name}.rank{r}.pt") for r in range(p)]
        by_stage = {stage: g for x in parts for stage, g in x["grads"].items()}
        runs.append(
            (
                next(x["loss"] for x in parts if x["loss"] is not None),
                [g for st in sorted(by_stage) for g in by_stage[st]],
            )
        )
    (loss, grads), (torch_loss, torch_grads) = runs
    assert torch_loss == loss
    assert [k for k, (a, b) in enumerate(zip(grads, torch_grads)) if not torch.equal(a, b)] == []
