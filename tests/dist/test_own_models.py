"""Your own model under every schedule (issue "Your own model"): each Hugging Face architecture
ppx splits (Llama, Qwen2, Mistral with a sliding window shorter than the sequence, GPT-2 with its
tied embedding) and a user's module by import path (examples/tiny_gpt.py, tied too), after one
pipelined step on real gloo processes, give the unsplit model's loss and every parameter's
gradient, by name: fp32 as tests/dist/test_gradients.py holds the built-in models (rtol 1e-5),
bf16 within tests/dist/test_precision.py's 3e-2; every training schedule at p=2, 1F1B, ZB-H1
and interleaved at p=4; with train.recompute=full; and with parallel.data=2 (replicate, and
FSDP2 for one architecture); the module cut by torch's tracer too."""

from __future__ import annotations

import functools
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
from ppx.schedules import registry

pytest.importorskip("transformers")

SMALL = ["model.hidden=32", "model.heads=4", "model.vocab_size=64", "model.seq_len=16"]
MODELS = {
    "llama": [
        "model.kind=hf",
        "model.hf_config=llama",
        "model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2}",
    ],
    "qwen2": [
        "model.kind=hf",
        "model.hf_config=qwen2",
        "model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2}",
    ],
    # a window shorter than the sequence: the sliding mask is not the causal one
    "mistral": [
        "model.kind=hf",
        "model.hf_config=mistral",
        "model.hf_overrides={intermediate_size: 64, num_key_value_heads: 2, sliding_window: 6}",
    ],
    "gpt2": [
        "model.kind=hf",
        "model.hf_config=gpt2",
        "model.hf_overrides={resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}",
    ],
    "module": ["model.kind=module", "model.module=examples.tiny_gpt:build", "model.units=[embed,blocks,head]"],
}
TRAINING = [n for n in registry.FAMILIES if n != "forward_only"]
EIGHT = {"zb_h2", "zbv", "dualpipev"}  # microbatches 8 (dualpipev needs m >= 2p)


def overrides(model: str, sched: str, p: int, *extra: str) -> list[str]:
    v = registry.default_virtual(sched)
    depth = 6 if p * v > 4 else 4  # units = depth + 2: every stage gets one
    size = [f"model.layers={depth}"] if model != "module" else [f"model.args={{depth: {depth}, width: 32, heads: 4}}"]
    m = 8 if sched in EIGHT else 4
    return (
        MODELS[model]
        + SMALL
        + size
        + [
            f"pipeline.schedule={sched}",
            f"pipeline.stages={p}",
            f"pipeline.microbatches={m}",
            "train.batch_size=8",
            "train.seed=3",
            *extra,
        ]
    )


# ppx's data: the MLP kind's teacher targets and MSE; an nn.Sequential of 4 blocks of width 16
REGRESSION = ["model.data=regression", "model.hidden=16", "model.args={width: 16, depth: 4}"]


def own(builder: str, sched: str, *keys: str) -> list[str]:
    """A model of helpers/own_module.py's ``builder`` (or a helpers file's, "file:builder") at
    2 stages, 4 microbatches of 2 samples."""
    return [
        "model.kind=module",
        f"model.module=helpers.{builder if ':' in builder else 'own_module:' + builder}",
        *keys,
        f"pipeline.schedule={sched}",
        "pipeline.stages=2",
        "pipeline.microbatches=4",
        "train.batch_size=8",
        "train.seed=3",
    ]


def cases(p: int) -> dict[str, list[str]]:
    if p == 2:
        out = {f"{mo}-{s}": overrides(mo, s, 2) for mo in MODELS for s in TRAINING}
        out |= {f"{mo}-zb_h1-recompute_full": overrides(mo, "zb_h1", 2, "train.recompute=full") for mo in MODELS}
        out |= {f"{mo}-zbv-bf16": overrides(mo, "zbv", 2, "train.dtype=bf16") for mo in MODELS}
        out["module-1f1b-bf16-m8"] = overrides("module", "1f1b", 2, "train.dtype=bf16", "pipeline.microbatches=8")
        # torch's tracer cuts the module at the same units (untied: the tracer does not sum copies)
        # an nn.Sequential without model.units, the user's batch and loss functions
        out["sequential-zb_h1-own_batch_and_loss"] = own(
            "build",
            "zb_h1",
            "model.batch_fn=helpers.own_module:batch",
            "model.loss_fn=helpers.own_module:loss",
            REGRESSION[2],
        )
        # a Linear's weight read outside its own call (a tied autoencoder; a layer only ever read):
        # under auto its stage keeps the graph (stored, W alone dropped that use's gradient)
        for builder in ("tied_outside", "weight_read_only"):
            out[f"{builder}-zb_h1"] = own(builder, "zb_h1", *REGRESSION[:2], "model.args={width: 16}")
        # units that hand on a transposed view (MLP-Mixer's token mixing): sent contiguous
        out["token_mixing-zbv"] = own(
            "token_mixing",
            "zbv",
            "model.batch_fn=helpers.own_module:token_batch",
            "model.loss_fn=helpers.own_module:loss",
            "model.args={tokens: 4, width: 16}",
        )
        out["sequential-1f1b-regression"] = own("build", "1f1b", *REGRESSION)
        # units that change their input in place, beginning stages: each stage hands its module
        # a copy (its input was a leaf autograd refused; recomputed, stage 0 doubled its data twice)
        out["in_place_inputs-zbv"] = own("in_place_inputs", "zbv", *REGRESSION[:2])
        out["in_place_inputs-1f1b-recompute_full"] = own(
            "in_place_inputs", "1f1b", *REGRESSION[:2], "train.recompute=full", "pipeline.layers_per_stage=[1,3]"
        )
        # targets flattened to a row per feature (a target per token's way): split with their samples
        out["flat_targets-1f1b"] = own(
            "build",
            "1f1b",
            "model.batch_fn=helpers.own_batches:batch_flat_targets",
            "model.loss_fn=helpers.own_batches:loss_flat",
            REGRESSION[2],
        )
        # a batch function drawing from torch's global generator: every rank, every run, the same batch
        out["torch_rng_batch-zbv"] = own(
            "build", "zbv", "model.batch_fn=helpers.own_batches:batch_from_torch", *REGRESSION[:2]
        )
        # units routing each sample to one of two experts (boolean indexing: the checks run them on
        # the CPU, where the meta device cannot; they were refused)
        out["routed-zb_h1"] = own("routed", "zb_h1", *REGRESSION[:2])
        # a frozen feature extractor its forward calls under torch.no_grad(): no check refuses it
        out["frozen_input-zb_h1"] = own(
            "chain", "zb_h1", *REGRESSION[:2], "model.args={way: frozen_inp}", "model.units=[inp,blocks,out]"
        )
        # a stage of parameter-free units (an activation): no W to defer, no optimizer state
        for end, cut in (("last", "[3,1]"), ("first", "[1,3]")):
            out[f"parameter_free_{end}_stage-zb_h1"] = own(
                f"parameter_free_{end}", "zb_h1", *REGRESSION[:2], f"pipeline.layers_per_stage={cut}"
            )
        # units handing on tensors of different shapes and dtypes, each stage receiving its own: an
        # MLP's widths (every family), a CNN's narrowing maps, float64 between float32 units, and
        # integers (bins, then their embedding) inside a stage
        for s in TRAINING:
            out[f"widths-{s}"] = own("own_shapes:widths", s, *REGRESSION[:2])
        out["widths-zb_h1-bf16"] = own("own_shapes:widths", "zb_h1", *REGRESSION[:2], "train.dtype=bf16")
        out["widths-zbv-recompute_full"] = own("own_shapes:widths", "zbv", *REGRESSION[:2], "train.recompute=full")
        for s in ("zb_h1", "zbv"):
            out[f"convnet-{s}"] = own(
                "own_shapes:convnet",
                s,
                "model.batch_fn=helpers.own_shapes:images",
                "model.loss_fn=helpers.own_shapes:classes",
            )
        cnn = ("model.batch_fn=helpers.own_shapes:images", "model.loss_fn=helpers.own_shapes:classes")
        store = "train.split_backward=store"  # (its convolutions' inputs and output gradients kept for W)
        out["convnet-zb_h1-store"] = own("own_shapes:convnet", "zb_h1", *cnn, store)
        out["convnet-zbv-store-bf16"] = own("own_shapes:convnet", "zbv", *cnn, store, "train.dtype=bf16")
        out["double_middle-1f1b"] = own("double_middle", "1f1b", *REGRESSION[:2])
        keys = (*REGRESSION[:2], "train.dtype=bf16", "pipeline.layers_per_stage=[2,1]")  # (float64 at the cut)
        out["double_matmul-1f1b-bf16"] = own("own_shapes:double_matmul", "1f1b", *keys)
        out["quantized-zb_h1"] = own(
            "own_shapes:quantized", "zb_h1", *REGRESSION[:2], "pipeline.layers_per_stage=[2,2]"
        )
        out["module-1f1b-tracer"] = overrides("module", "1f1b", 2, "model.args.tied=false", "pipeline.split=tracer")
        out["module-zb_h1-tracer-split_points"] = overrides(
            "module", "zb_h1", 2, "model.args.tied=false", "pipeline.split=tracer", "model.split_points=[blocks.1]"
        )
        return out
    return {f"{mo}-{s}-p4": overrides(mo, s, 4) for mo in MODELS for s in ("1f1b", "zb_h1", "interleaved_1f1b")}


DP = {f"{mo}-zb_h1-dp2": overrides(mo, "zb_h1", 2, "parallel.data=2") for mo in MODELS}
DP["gpt2-1f1b-dp2-shard"] = overrides("gpt2", "1f1b", 2, "parallel.data=2", "parallel.data_shard=true")
DP["widths-zb_h1-dp2"] = own("own_shapes:widths", "zb_h1", *REGRESSION[:2], "parallel.data=2")


def _local(t):
    return None if t is None else (t.to_local() if hasattr(t, "to_local") else t).clone()


def _worker(rank: int, world: int, port: int, out: str, which: str) -> None:
    import os

    os.chdir(REPO)  # examples.tiny_gpt imports from the checkout's root
    with gloo_group(rank, world, port):
        todo = DP if which == "dp" else cases(world)
        for name, o in todo.items():
            cfg = config.load(None, o)
            layout = Layout(cfg.pipeline.stages, cfg.parallel.data, rank)
            pipe = build_share(cfg, resolve_schedule(cfg), layout, torch.device("cpu"), "gloo", [])
            loss = pipe.step(0)
            grads = {s: {n: _local(q.grad) for n, q in mod.named_parameters()} for s, mod in pipe.modules.items()}
            torch.save({"loss": loss, "grads": grads, "replica": layout.dp_rank}, Path(out) / f"{name}.rank{rank}.pt")
            dist.barrier()


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory):
    """("p2" | "p4" | "dp") -> the folder of every case's saved loss and gradients."""
    done: dict = {}

    def get(which: str) -> Path:
        if which not in done:
            out = tmp_path_factory.mktemp(f"own_{which}")
            world = {"p2": 2, "p4": 4, "dp": 4}[which]
            try:
                spawn(_worker, (world, free_port(), str(out), which), world)
                done[which] = out
            except Exception as e:
                done[which] = e
        if isinstance(done[which], BaseException):
            raise RuntimeError(f"the {which} job failed") from done[which]
        return done[which]

    return get


def reference(o: list[str]):
    """Loss and gradients by name (tied names included) of the unsplit model, one process."""
    return _reference(tuple(x for x in o if not x.startswith(("pipeline.", "parallel."))))


@functools.cache  # (the cases of one model share it: only their pipeline keys differ)
def _reference(o: tuple[str, ...]):
    cfg = config.load(None, list(o))
    model = build_reference(cfg)
    kind = models.kind(cfg.model.kind)
    x, y = kind.make_batch(cfg.model, cfg.train.seed, cfg.train.batch_size, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train.dtype == "bf16"):
        loss = kind.loss(model(x), y)
    loss.backward()
    return loss.item(), {n: q.grad for n, q in model.named_parameters(remove_duplicate=False)}


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def check(parts: list[dict], name: str, o: list[str], replicas: int = 1) -> None:
    ref_loss, ref = reference(o)
    bf16 = "bf16" in name
    losses = [x["loss"] for x in parts if x["loss"] is not None]
    assert len(losses) == replicas, "each replica's last rank reports the loss"
    assert sum(losses) / replicas == pytest.approx(ref_loss, rel=3e-2 if bf16 else 1e-6)
    shard = name.endswith("shard")
    for d in range(replicas):
        grads = {n: g for x in parts if x["replica"] == d for stage in x["grads"].values() for n, g in stage.items()}
        assert set(grads) <= set(ref) and {n for n in ref if ref[n] is not None} <= set(grads) | _tied_aliases(ref)
        for n, g in grads.items():
            if ref[n] is None:  # (frozen: no gradient in either)
                assert g is None, n
                continue
            want = ref[n].chunk(replicas)[d] if shard else ref[n]
            assert g is not None and g.shape == want.shape, n
            if bf16:
                assert rel_err(g, want) <= 3e-2, f"{n}: relative error {rel_err(g, want):.2e}"
            else:
                torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def _tied_aliases(ref: dict) -> set[str]:
    """Names of a tied parameter the pipelined stages need not all hold (each is one tensor)."""
    seen: dict[int, list[str]] = {}
    for n, g in ref.items():
        if g is not None:
            seen.setdefault(id(g), []).append(n)
    return {n for names in seen.values() if len(names) > 1 for n in names}


@pytest.mark.parametrize("name", list(cases(2)))
def test_every_schedule_at_p2_gives_the_unsplit_models_gradients(pipelined, name):
    out = pipelined("p2")
    check([torch.load(out / f"{name}.rank{r}.pt") for r in range(2)], name, cases(2)[name])


@pytest.mark.parametrize("name", list(cases(4)))
def test_p4_gives_the_unsplit_models_gradients(pipelined, name):
    out = pipelined("p4")
    check([torch.load(out / f"{name}.rank{r}.pt") for r in range(4)], name, cases(4)[name])


@pytest.mark.parametrize("name", list(DP))
def test_two_replicas_give_the_unsplit_models_gradients(pipelined, name):
    out = pipelined("dp")
    check([torch.load(out / f"{name}.rank{r}.pt") for r in range(4)], name, DP[name], replicas=2)


def test_a_module_whose_stream_is_in_the_compute_dtype_gives_the_same_bf16_bits_on_any_split(pipelined):
    """examples/tiny_gpt.py casts its embedding's output (`to_compute_dtype`): 1F1B's two
    stages and ZB-V's four give one loss and the same gradients (its fp32 stream was rounded
    at each boundary: 1e-5 of the loss apart)."""
    out = pipelined("p2")
    got = []
    for name in ("module-1f1b-bf16-m8", "module-zbv-bf16"):
        parts = [torch.load(out / f"{name}.rank{r}.pt") for r in range(2)]
        grads = {n: g for x in parts for stage in x["grads"].values() for n, g in stage.items()}
        got.append((next(x["loss"] for x in parts if x["loss"] is not None), grads))
    (loss, grads), (zbv_loss, zbv_grads) = got
    assert zbv_loss == loss and grads.keys() == zbv_grads.keys()
    assert [n for n in grads if not torch.equal(grads[n], zbv_grads[n])] == []
