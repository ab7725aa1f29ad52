"""`ppx run` with ``parallel.data=2``: 2 pipeline ranks x 2 replicas = 4 gloo processes. The
losses equal the one-pipeline run of the same global batch, and the replicas' gradient
reduction is its own time category everywhere a run reports time: metrics.jsonl, summary,
TensorBoard and W&B scalars, timeline.json, the breakdown and the prediction."""

from __future__ import annotations

import json
import os

import pytest

from helpers import ppx, read_json, read_jsonl, wandb_file

SMALL = ["model.hidden=32", "train.steps=3", "train.batch_size=16", "instrument.timeline_steps=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    out = {}
    for name, extra in (
        ("one", []),
        ("replicate", ["parallel.data=2", "logging.wandb.mode=offline"]),
        # profiled at step 2 (wait 1, warmup 1, active 1): each replica's traces of its own
        ("shard", ["parallel.data=2", "parallel.data_shard=true", "profile.enabled=true", "profile.active=1"]),
        # FSDP2 with fp16 loss scaling (DTensor gradients unscaled) and selective recomputation
        # (its first forward's all-gather inside the checkpoint's dispatch mode)
        (
            "shard-fp16-selective",
            ["parallel.data=2", "parallel.data_shard=true", "train.dtype=fp16", "train.recompute=selective"],
        ),
    ):
        d = tmp / name
        r = ppx("run", "1f1b_2cpu", *SMALL, *extra, f"run.dir={d}", timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        # nothing but ppx's lines (fp16's unscale on DTensor gradients warned every step)
        assert "Warning" not in r.stderr, r.stderr[-3000:]
        out[name] = d
    return out


@pytest.mark.parametrize("how", ["replicate", "shard"])
def test_replicas_train_like_one_pipeline_on_the_global_batch(runs, how):
    one = read_json(runs["one"] / "summary.json")
    dp = read_json(runs[how] / "summary.json")
    assert (dp["world_size"], dp["data_parallel"], dp["processes"]) == (2, 2, 4)
    ranks = read_json(runs[how] / "env.json")["ranks"]
    assert len(ranks) == 4
    # runtime.pin_cpus: a replica's pipeline neighbours never share a CPU (on 2 CPUs, 0 and 1)
    cpus = {(r["pipeline_rank"], r["replica"]): r["cpus"] for r in ranks}
    assert len(os.sched_getaffinity(0)) < 2 or all(cpus[0, d] != cpus[1, d] for d in range(2)), cpus
    assert dp["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert dp["losses"] != pytest.approx(one["losses"][:1] * 3, rel=1e-9)  # it trains: losses move


def test_each_replicas_profiler_traces_are_named_by_its_pipeline_rank(runs):
    """rank<r> is pipeline rank r, as in every rank-indexed file; the other replica's
    rank<r>-replica1 (process 2r+1, whose traces were rank<2r+1>)."""
    traces = {t.name.split(".")[0]: t for t in (runs["shard"] / "tb").glob("*.pt.trace.json")}
    assert sorted(traces) == ["rank0", "rank0-replica1", "rank1", "rank1-replica1"]
    for name, t in traces.items():
        stage = name[4]
        labels = {e["name"] for e in json.loads(t.read_text())["traceEvents"] if e.get("ph") == "X"}
        assert {f"PP:{stage}F0", f"PP:{stage}B1", "ProfilerStep#2"} <= labels, (name, sorted(labels)[:20])
        assert not any(x.startswith(f"PP:{1 - int(stage)}") for x in labels), name


def test_sharded_replicas_train_in_fp16_with_recomputation(runs):
    one = read_json(runs["one"] / "summary.json")
    mixed = read_json(runs["shard-fp16-selective"] / "summary.json")
    assert (mixed["data_parallel"], mixed["dtype"], mixed["recompute"]) == (2, "fp16", "selective")
    assert mixed["losses"] == pytest.approx(one["losses"], rel=5e-3)  # fp16's tolerance
    lines = read_jsonl(runs["shard-fp16-selective"] / "metrics.jsonl")
    assert mixed["optimizer_steps_skipped"] == sum(x["optimizer_skipped"] for x in lines) == 0


def test_the_reduction_is_its_own_category_everywhere(runs):
    d = runs["replicate"]
    for line in read_jsonl(d / "metrics.jsonl"):
        for r in line["ranks"]:
            assert r["dp_comm_s"] > 0, (line["step"], r["rank"])
            busy = r["compute_s"] + r["comm_s"] + r["dp_comm_s"]
            assert r["idle_s"] == pytest.approx(max(line["step_time_s"] - busy, 0.0), abs=1e-9)  # never idle
    summary = read_json(d / "summary.json")
    assert all(r["dp_comm_s"] > 0 for r in summary["ranks"])
    assert all(r["dp_comm_s"] == 0 for r in read_json(runs["one"] / "summary.json")["ranks"])
    # the timeline: one reduce per stage per step, after the stage's last backward
    events = json.loads((d / "timeline.json").read_text())["traceEvents"]
    reduces = [e for e in events if e.get("cat") == "dp_comm"]
    assert sorted({e["name"] for e in reduces}) == ["0REDUCE_GRAD", "1REDUCE_GRAD"]
    assert len(reduces) == 2 * 2  # 2 stages x the 2 timeline steps
    # TensorBoard and W&B take the same per-rank scalars
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(d / "tb"))
    acc.Reload()
    assert {"dp_comm_s/rank0", "dp_comm_s/rank1"} <= set(acc.Tags()["scalars"])
    (wb,) = (d / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [row for row in wandb_file.history(wb) if "loss" in row]
    assert len(rows) == 3 and all(row["dp_comm_s/rank1"] > 0 for row in rows)
    # the prediction simulates the reductions at their measured cost
    assert summary["measured_costs"]["action_s"]["1REDUCE_GRAD"] > 0


def test_reductions_come_after_each_stage_last_backward_and_its_send():
    from ppx.schedules import registry
    from ppx.schedules.comms.program import compile_program

    s = registry.build("interleaved_1f1b", 2, 4, 2)
    for r in range(2):
        items = compile_program(s.actions[r], s.stage_to_rank, 0, s.cells(r), reduce=True)
        kinds = [it.kind for it in items]
        for stage in s.stages_of(r):
            at = next(k for k, it in enumerate(items) if it.label == f"{stage}REDUCE_GRAD")
            later = items[at + 1 :]
            assert not any(
                it.kind == "compute" and it.actions[0].stage == stage and it.actions[0].op.is_backward for it in later
            )
            assert not any(
                it.kind == "post"
                and any(a.stage == stage and a.op.is_send and a.op.value == "SEND_B" for a in it.actions)
                for it in later
            )
        assert kinds.count("reduce") == 2 and kinds[-1] == "drain"


def test_stores_under_fsdp2s_mixed_precision_keep_the_compute_dtype(tmp_path):
    """The transformer under ZB-H1 storing, fp16 and selective recomputation, sharded over 2
    replicas: FSDP2's policy makes the fp16 weights (ppx makes no copies of its own), and each
    layer's input is still cast as autocast casts it, so W multiplies fp16 by fp16 (a layer
    norm's fp32 output, stored as it was, met an fp16 output gradient in W and failed the
    run). Its losses are one pipeline's on the whole batch, to fp16's tolerance."""
    keys = ["transformer_1f1b_2cpu", "model.hidden=32", "pipeline.schedule=zb_h1", "train.split_backward=store"]
    keys += ["train.dtype=fp16", "train.recompute=selective", "train.steps=2", "train.batch_size=16"]
    losses = {}
    for name, extra in (("one", []), ("shard", ["parallel.data=2", "parallel.data_shard=true"])):
        r = ppx("run", *keys, *extra, f"run.dir={tmp_path / name}", timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        s = read_json(tmp_path / name / "summary.json")
        assert {way["mode"] for way in s["split_backward"].values()} == {"store"}, s["split_backward"]
        losses[name] = s["losses"]
    assert losses["shard"] == pytest.approx(losses["one"], rel=5e-3)
