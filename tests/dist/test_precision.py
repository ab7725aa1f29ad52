"""train.dtype and train.recompute on real gloo processes (p = 2): after one pipelined step the
loss and every gradient equal a single-process reference run under the same autocast dtype,
the boundary tensors travel in the compute dtype, and fp16's loss scaling skips an overflowed
step on every rank alike.

Tolerances (relative error of each parameter's gradient, by norm, and of the loss): fp32 and
recomputation in fp32 as tests/dist/test_gradients.py (rtol 1e-5); bf16 3e-2 and fp16 5e-3
(8 and 11 mantissa bits; the pipeline also rounds the activations at each stage boundary to
the compute dtype, where the reference keeps them in whatever dtype autocast left them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import free_port
from helpers.spawn import gloo_group, spawn
from ppx import config, models
from ppx.config import resolve_schedule
from ppx.engine.comm import P2P
from ppx.engine.precision import DTYPES, step_optimizer
from ppx.engine.rank import build_rank, build_reference

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
}
SCHEDULES = {"1f1b": [], "zb_h1": [], "interleaved_1f1b": ["pipeline.virtual_stages=2"]}
V2 = ["pipeline.virtual_stages=2"]
MORE_SCHEDULES = {  # recomputation on every other family (8 microbatches where the schedule needs them)
    "gpipe": [],
    "zb_h2": ["pipeline.microbatches=8"],
    "looped_bfs": V2,
    "interleaved_zb": V2,
    "zbv": ["pipeline.microbatches=8"],
    "dualpipev": [],
}
TOL = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 5e-3}


def overrides(model: str, sched: str, dtype: str = "fp32", recompute: str = "none") -> list[str]:
    return (
        MODELS[model]
        + [
            f"pipeline.schedule={sched}",
            "pipeline.stages=2",
            "pipeline.microbatches=4",
            "train.batch_size=8",
            "train.seed=3",
            f"train.dtype={dtype}",
            f"train.recompute={recompute}",
        ]
        + {**SCHEDULES, **MORE_SCHEDULES}[sched]
    )


CASES = {f"{mo}-{s}-{dt}": overrides(mo, s, dt) for mo in MODELS for s in SCHEDULES for dt in ("bf16", "fp16")}
RECOMPUTE = {
    f"{mo}-{s}-fp32-{rc}": overrides(mo, s, "fp32", rc)
    for mo in MODELS
    for s in SCHEDULES
    for rc in ("full", "selective")
}
RECOMPUTE["transformer-zb_h1-fp32-[full,selective]"] = overrides("transformer", "zb_h1", "fp32", "[full,selective]")
RECOMPUTE.update(
    {
        f"transformer-{s}-fp32-full": overrides("transformer", s, "fp32", "full")
        for s in MORE_SCHEDULES  # selective runs the same I/W path, tested on 1f1b, zb_h1 and interleaved
    }
    | {"transformer-dualpipev-fp32-selective": overrides("transformer", "dualpipev", "fp32", "selective")}
)
RECOMPUTE["mlp-zb_h1-fp32-selective-tracer"] = overrides("mlp", "zb_h1", "fp32", "selective") + [
    "pipeline.split=tracer"
]
RECOMPUTE["transformer-zb_h1-bf16-selective"] = overrides("transformer", "zb_h1", "bf16", "selective")
RECOMPUTE["transformer-1f1b-bf16-full"] = overrides("transformer", "1f1b", "bf16", "full")
# llama (RoPE tables cast to the compute dtype, GQA through SDPA): a few cases, not every loop's
MODELS["llama"] = MODELS["transformer"][1:] + ["model.kind=llama", "model.heads=4", "model.kv_heads=2"]
CASES["llama-1f1b-bf16"] = overrides("llama", "1f1b", "bf16")
CASES["llama-zb_h1-fp16"] = overrides("llama", "zb_h1", "fp16")
RECOMPUTE["llama-zb_h1-fp32-selective"] = overrides("llama", "zb_h1", "fp32", "selective")
RECOMPUTE["llama-1f1b-bf16-full"] = overrides("llama", "1f1b", "bf16", "full")
CASES.update(RECOMPUTE)
# torch's tracer cut at two places: its graph casts the embedding's output as the layer split does
# (`to_compute_dtype`, which the tracer dropped: the stream was rounded at each boundary)
for cut in ("[1,3]", "[3,1]"):
    CASES[f"transformer-1f1b-bf16-tracer-{cut}"] = overrides("transformer", "1f1b", "bf16") + [
        "pipeline.split=tracer",
        f"pipeline.layers_per_stage={cut}",
    ]


class RecordingP2P(P2P):
    """P2P that notes the dtype and bytes of every tensor it sends or receives."""

    def post(self, ops):
        for send, t, _, kind in ops:
            self.seen.append(("send" if send else "recv", kind, t.dtype, t.numel() * t.element_size()))
        return super().post(ops)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with gloo_group(rank, world, port):
        comm = P2P.for_backend("gloo")
        recording = RecordingP2P(*comm.groups.values())
        for name, o in CASES.items():
            cfg = config.load(None, o)
            recording.seen = []
            pipe = build_rank(cfg, resolve_schedule(cfg), rank, "cpu", recording)
            calls = dict.fromkeys(pipe.modules, 0)  # forwards run per stage, recomputations included
            for stage, mod in pipe.modules.items():
                mod.register_forward_pre_hook(
                    lambda *_, stage=stage, calls=calls: calls.__setitem__(stage, calls[stage] + 1)
                )
            linear = set()  # dtypes of every Linear's output: the compute dtype under autocast
            for mod in pipe.modules.values():
                for sub in mod.modules():
                    if isinstance(sub, torch.nn.Linear):
                        sub.register_forward_hook(lambda _m, _i, y, linear=linear: linear.add(y.dtype))
            loss = pipe.step(0)
            if pipe.precision.scaler is not None:  # fp16: the gradients of the scaled loss, unscaled
                assert not pipe.precision.scaler.unscale(pipe.parameters())
            grads = {stage: [q.grad.clone() for q in mod.parameters()] for stage, mod in pipe.modules.items()}
            torch.save(
                {"loss": loss, "grads": grads, "comm": recording.seen, "calls": calls, "linear": linear},
                Path(out) / f"{name}.rank{rank}.pt",
            )
            dist.barrier()
        _overflow(rank, out)


def _overflow(rank: int, out: str) -> None:
    """fp16: an inf in rank 1's gradients of step 1; every rank must skip that step alike."""
    cfg = config.load(None, overrides("mlp", "1f1b", "fp16"))
    pipe = build_rank(cfg, resolve_schedule(cfg), rank, "cpu", P2P.for_backend("gloo"))
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    log = []
    for step in range(3):
        opt.zero_grad(set_to_none=True)
        pipe.step(step)
        if step == 1 and rank == 1:
            pipe.parameters()[0].grad[0] = float("inf")
        before = [q.detach().clone() for q in pipe.parameters()]
        stepped = step_optimizer(pipe, opt, torch.device("cpu"))
        changed = any(not torch.equal(b, q) for b, q in zip(before, pipe.parameters()))
        log.append((stepped, changed, pipe.precision.scaler.scale))
    torch.save(log, Path(out) / f"overflow.rank{rank}.pt")


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("precision")
    spawn(_worker, (2, free_port(), str(out)), 2)
    return out


def reference(o: list[str]):
    """Loss and gradients of the whole model in one process, under the same autocast."""
    cfg = config.load(None, [x for x in o if not x.startswith("pipeline.")])
    model = build_reference(cfg)
    kind = models.kind(cfg.model.kind)
    x, y = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    dtype = DTYPES[cfg.train.dtype]
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not torch.float32):
        loss = kind.loss(model(x), y)
    loss.backward()
    return loss.item(), [q.grad for q in model.parameters()]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


def check_against_reference(out: Path, name: str, o: list[str], tol: float) -> float:
    """Assert the pipelined loss and gradients of case ``name`` match; return the worst error."""
    ref_loss, ref_grads = reference(o)
    parts = [torch.load(out / f"{name}.rank{r}.pt") for r in range(2)]
    (loss,) = [x["loss"] for x in parts if x["loss"] is not None]
    assert loss == pytest.approx(ref_loss, rel=tol)
    by_stage = {stage: g for x in parts for stage, g in x["grads"].items()}
    grads = [g for stage in sorted(by_stage) for g in by_stage[stage]]
    assert len(grads) == len(ref_grads)
    worst = 0.0
    for k, (g, ref) in enumerate(zip(grads, ref_grads)):
        assert g.dtype is torch.float32, f"param {k}: master gradients stay fp32"
        worst = max(worst, rel_err(g, ref))
        assert rel_err(g, ref) <= tol, f"param {k}: relative error {rel_err(g, ref):.2e} > {tol}"
    return worst


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_under_same_autocast(pipelined, name):
    dtype = name.split("-")[2]
    for r in range(2 if "tracer" not in name else 0):  # autocast ran: every Linear's output is in the compute dtype
        assert torch.load(pipelined / f"{name}.rank{r}.pt")["linear"] == {DTYPES[dtype]}
    worst = check_against_reference(pipelined, name, CASES[name], TOL[dtype])
    print(f"{name}: worst gradient relative error {worst:.2e}")


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("transformer") and n not in RECOMPUTE])
def test_boundaries_travel_in_compute_dtype(pipelined, name):
    """Every activation and gradient sent or received is in the compute dtype: half the bytes
    of the fp32 boundary."""
    dtype = DTYPES[name.split("-")[2]]
    cfg = config.load(None, CASES[name])
    shape, _ = models.kind("transformer").boundary(cfg.model, 2)
    fp32_bytes = torch.Size(shape).numel() * 4
    for r in range(2):
        seen = torch.load(pipelined / f"{name}.rank{r}.pt")["comm"]
        assert seen and {kind for _, kind, _, _ in seen} == {"F", "B"}
        assert all(dt is dtype and nbytes == fp32_bytes // 2 for _, _, dt, nbytes in seen), seen


def test_fp16_overflow_skips_the_step_on_every_rank(pipelined):
    logs = [torch.load(pipelined / f"overflow.rank{r}.pt") for r in range(2)]
    assert logs[0] == logs[1], "both ranks step or skip, and keep the same scale"
    (s0, c0, scale0), (s1, c1, scale1), (s2, c2, scale2) = logs[0]
    assert s0 and c0 and scale0 == 2.0**16
    assert not s1 and not c1 and scale1 == 2.0**15, "the overflow on rank 1 skips rank 0's step too"
    assert s2 and c2 and scale2 == 2.0**15


@pytest.mark.parametrize("name", list(RECOMPUTE))
def test_recompute_reruns_each_forward_once(pipelined, name):
    """Each recomputing stage runs its forward twice per microbatch (the forward, then once in
    its B or I: a split backward's W reuses I's graph); a stage without recomputation once."""
    cfg = config.load(None, CASES[name])
    modes = cfg.train.recompute if isinstance(cfg.train.recompute, list) else None
    m = cfg.pipeline.microbatches
    for r in range(2):
        for stage, n in torch.load(pipelined / f"{name}.rank{r}.pt")["calls"].items():
            mode = modes[stage] if modes else cfg.train.recompute
            assert n == (2 * m if mode != "none" else m), (stage, n)


def test_a_traced_split_in_bf16_gives_the_same_bits_wherever_it_is_cut(pipelined):
    got = []
    for cut in ("[1,3]", "[3,1]"):
        parts = [torch.load(pipelined / f"transformer-1f1b-bf16-tracer-{cut}.rank{r}.pt") for r in range(2)]
        grads = [g for x in parts for stage in sorted(x["grads"]) for g in x["grads"][stage]]
        got.append((next(x["loss"] for x in parts if x["loss"] is not None), grads))
    (loss, grads), (other_loss, other_grads) = got
    assert other_loss == loss and len(grads) == len(other_grads)
    assert [k for k, (a, b) in enumerate(zip(grads, other_grads)) if not torch.equal(a, b)] == []
