"""`ppx run` predicts each rank's peak saved activations from the bytes one microbatch saves
per stage (the schedule walked: F adds, B and W free) and reports it next to the measured
peak: within 5% on the transformer and llama, across placements (exactly on the MLP under
every schedule: tests/dist/test_memory_walk.py, the same counters and walk in one process
group; and through `ppx run` at p=4 under GPipe and 1F1B: tests/e2e/test_instrumentation.py)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from statistics import median

import pytest

from helpers import ppx, read_json
from ppx import config
from ppx.units import byte_unit

RUNS = {
    "transformer-zbv": ["transformer_1f1b_2cpu", "pipeline.schedule=zbv", "pipeline.microbatches=4"],
    "llama-interleaved": [
        "llama_tiny_1f1b_2cpu",
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.virtual_stages=2",
        "pipeline.microbatches=4",
    ],
    "llama-dualpipev-recompute": ["llama_tiny_1f1b_2cpu", "pipeline.schedule=dualpipev", "train.recompute=selective"],
    # fully recomputed: a few KiB a rank (the stages' inputs), said in KiB, not as 0.00 MiB
    "llama-1f1b-full-recompute": ["llama_tiny_1f1b_2cpu", "train.recompute=full"],
    # a split backward that stores, every stage (auto would run the first one's whole): each
    # microbatch's graph goes at its I, its stores stay to W
    "llama-zb_h1-stores-bf16": [
        "llama_tiny_1f1b_2cpu",
        "pipeline.schedule=zb_h1",
        "train.dtype=bf16",
        "train.split_backward=store",
    ],
    # store with the embedding alone on stage 0: nothing to store there, it keeps its graph
    "llama-zb_h1-store-embedding-alone": [
        "llama_tiny_1f1b_2cpu",
        "pipeline.schedule=zb_h1",
        "train.split_backward=store",
        "pipeline.layers_per_stage=[1,5]",
    ],
    # auto: the first stage whole (its I the whole backward, its W nothing), the last storing
    "llama-zb_h1-auto": ["llama_tiny_1f1b_2cpu", "pipeline.schedule=zb_h1"],
    # drain: the last stage stores for the microbatches whose W follows its last F, B's for the rest
    "llama-zb_h1-drain": ["llama_tiny_1f1b_2cpu", "pipeline.schedule=zb_h1", "train.split_backward=drain"],
    # recomputed: the forward keeps its input, the I re-runs it and holds its stores or graph to W
    "transformer-zb_h1-recompute-stores": [
        "transformer_1f1b_2cpu",
        "pipeline.schedule=zb_h1",
        "train.recompute=full",
        "train.split_backward=store",
    ],
    "transformer-zb_h1-recompute-graph": [
        "transformer_1f1b_2cpu",
        "pipeline.schedule=zb_h1",
        "train.recompute=full",
        "train.split_backward=graph",
    ],
    # selective: the forward keeps the matmuls' outputs, and stores nothing (its I re-runs it)
    "llama-zb_h1-selective-stores": [
        "llama_tiny_1f1b_2cpu",
        "pipeline.schedule=zb_h1",
        "train.recompute=selective",
        "train.split_backward=store",
    ],
    "llama-zb_h1-selective-graph": [
        "llama_tiny_1f1b_2cpu",
        "pipeline.schedule=zb_h1",
        "train.recompute=selective",
        "train.split_backward=graph",
    ],
    # a Hugging Face model's rotary tables, each microbatch's own as its forward makes them
    # (shared by every microbatch, they were held once and predicted once a microbatch: +9.6%)
    "hf-llama-one-head-gpipe": [
        "hf_llama_tiny_1f1b_2cpu",
        "model.layers=2",
        "model.heads=1",
        "model.hf_overrides.num_key_value_heads=1",
        "train.batch_size=8",
        "pipeline.schedule=gpipe",
        "pipeline.microbatches=8",
    ],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_predicted_peak_saved_bytes_match_the_measured(shared_run, name):
    if name.startswith("hf-"):
        pytest.importorskip("transformers")
    # read only: test_beyond_1f1b.py reads the DualPipeV run's timeline too
    run = shared_run(*RUNS[name], "train.steps=2")
    d, r = run.dir, run.result
    s = read_json(d / "summary.json")
    assert len(s["saved_bytes_per_microbatch"]) == s["stages"] and min(s["saved_bytes_per_microbatch"]) > 0
    for row in s["ranks"]:
        assert row["predicted_peak_activation_bytes"] == pytest.approx(row["peak_activation_bytes"], rel=0.05), row
    assert abs(s["memory_prediction_error"]) <= 0.05
    # the line's unit is its largest figure's, and every figure reads as summary.json has it (a
    # rank that would read 0.00 in it, in its own unit)
    top = max(max(row["predicted_peak_activation_bytes"], row["peak_activation_bytes"]) for row in s["ranks"])
    unit, size = byte_unit(top)

    def pair(row):
        pred, meas = row["predicted_peak_activation_bytes"], row["peak_activation_bytes"]
        own, n = (unit, size) if max(pred, meas) >= 0.005 * size else byte_unit(max(pred, meas))
        return f"rank {row['rank']} {pred / n:.2f}/{meas / n:.2f}" + ("" if own == unit else f" {own}")

    pairs = ", ".join(pair(row) for row in s["ranks"])
    assert f"ppx: peak saved activations, predicted/measured {unit}: {pairs} (worst" in r.stdout, r.stdout
    assert unit == ("KiB" if name == "llama-1f1b-full-recompute" else "MiB")


def test_a_storing_split_backward_frees_most_of_a_microbatch_at_its_input_pass(shared_run, tmp_path):
    """llama-tiny under ZB-H1 stores on both stages (train.split_backward=store): summary.json
    says so with the bytes it weighed, and the memory model frees at each I the share the run
    measured; the graph's way frees nothing there and holds more at the peak."""
    stores = read_json(shared_run(*RUNS["llama-zb_h1-stores-bf16"], "train.steps=2").dir / "summary.json")
    graph = ppx(
        "run",
        *RUNS["llama-zb_h1-stores-bf16"],
        "train.split_backward=graph",
        "train.steps=2",
        "logging.tensorboard=false",
        "logging.wandb.mode=disabled",
        f"run.dir={tmp_path / 'graph'}",
    )
    assert graph.returncode == 0, graph.stderr[-2000:]
    graph = read_json(tmp_path / "graph" / "summary.json")
    for stage in ("0", "1"):
        info = stores["split_backward"][stage]
        assert info["mode"] == "store" and info["store_bytes"] < info["graph_bytes"], info
        assert graph["split_backward"][stage]["mode"] == "graph"
    assert all(0.1 < share < 1 for share in stores["input_freed_share"]), stores["input_freed_share"]
    # the graph's way frees nothing at an I and holds the output gradient its W takes again
    # beside the graph (a microbatch's boundary activation's bytes, in bf16; none on the last stage)
    assert graph["input_freed_share"][1] == 0.0 and -0.1 < graph["input_freed_share"][0] < 0, graph
    cfg = config.load(*RUNS["llama-zb_h1-stores-bf16"][:1], RUNS["llama-zb_h1-stores-bf16"][1:])
    boundary = cfg.train.batch_size // cfg.pipeline.microbatches * cfg.model.seq_len * cfg.model.hidden * 2
    held = -graph["input_freed_share"][0] * graph["saved_bytes_per_microbatch"][0]
    assert held == pytest.approx(boundary, rel=1e-6), (held, boundary)
    assert stores["saved_bytes_per_microbatch"] == graph["saved_bytes_per_microbatch"]  # the same forwards
    # ZB-H1's last rank holds p microbatches: with stores, its peak is lower
    assert stores["ranks"][1]["peak_activation_bytes"] < graph["ranks"][1]["peak_activation_bytes"]
    for s in (stores, graph):
        assert abs(s["memory_prediction_error"]) <= 0.05


def test_a_first_stage_whose_every_i_is_followed_by_its_w_runs_whole(shared_run):
    """Under auto, ZB-H1's first stage (each I followed at once by its W, nothing sent between)
    runs its whole backward in the I: summary.json says so, the I frees the whole microbatch
    (share 1), and the walk predicts the peak as measured; the last stage stores."""
    run = shared_run(*RUNS["llama-zb_h1-auto"], "train.steps=2")
    s = read_json(run.dir / "summary.json")
    assert s["split_backward"]["0"]["mode"] == "whole" and s["split_backward"]["1"]["mode"] == "store", s
    layers = s["split_backward"]["1"]["stored_layers"]
    line = next(x for x in run.result.stdout.splitlines() if x.startswith("ppx: split backward: "))
    assert line.startswith("ppx: split backward: stage 0 whole (each I followed at once by its W")
    assert f"stage 1 store ({layers} layers' inputs and output gradients from I to W: " in line, line
    assert s["input_freed_share"][0] == 1.0 and 0.1 < s["input_freed_share"][1] < 1
    assert abs(s["memory_prediction_error"]) <= 0.05
    # its W measures nothing: the I took the stage's whole backward (medians: one W sample a busy
    # neighbour's core preempted for a millisecond would put a mean of microseconds near 5% of I's)
    costs = s["cost_samples"]["action_s"]
    assert median(costs["0W"]) < 0.05 * median(costs["0I"]), costs


def _candidate(plan: Path, schedule: str) -> dict:
    """The candidate ``schedule`` of the plan written into ``plan``."""
    return next(c for c in read_json(plan / "plan.json")["candidates"] if c["schedule"] == schedule)


def test_drain_splits_only_the_microbatches_whose_w_fills_the_drain(shared_run, tmp_path):
    """train.split_backward=drain at p=2, m=4: rank 1 splits microbatches 2 and 3 (their W's
    follow its last F) and runs 0 and 1 whole, B's its timeline and costs measure apart from
    its I's; the prediction holds its step, and its peak, as measured; no theory (the family's
    formula splits every backward)."""
    run = shared_run(*RUNS["llama-zb_h1-drain"], "train.steps=2")
    s = read_json(run.dir / "summary.json")
    assert s["split_backward"]["0"]["mode"] == "whole", s["split_backward"]
    assert s["split_backward"]["1"]["mode"] == "store" and s["split_backward"]["1"]["whole_microbatches"] == [0, 1]
    line = next(x for x in run.result.stdout.splitlines() if x.startswith("ppx: split backward: "))
    assert line.endswith("; 2 microbatches whole (B))"), line
    costs = s["measured_costs"]["action_s"]
    assert {"0B", "0I", "1B", "1I", "1W"} <= set(costs), costs  # (stage 0: B's, then I's that run whole)
    assert s["bubble_fraction_theory"] is None
    assert abs(s["memory_prediction_error"]) <= 0.05
    assert abs(s["prediction_error"]["step_time"]) <= 0.25  # (two steps on two shared cores: the shape, not the figure)
    # ppx simulate --drain from that run simulates the list it ran (its B's as measured), with no theory
    r = ppx("simulate", "zb_h1", "--from-run", str(run.dir), "--drain")
    assert r.returncode == 0, r.stderr
    assert f"measured in {run.dir}: step " in r.stdout and "theory" not in r.stdout, r.stdout
    # stage 0 ran whole (its I the whole backward, its W nothing): the simulation takes its means
    # and the plan of the run's own list draws it as the run did, so both give the run's figures
    pred = s["predicted"]
    assert f"predicted step time {pred['step_time_of_mean_costs_s'] * 1e3:.2f} ms" in r.stdout, r.stdout
    r = ppx("plan", "--from-run", str(run.dir), "--schedules", "zb_h1", "--out", str(tmp_path / "own"))
    own = _candidate(tmp_path / "own", "zb_h1+drain")
    assert own["step_s"] == pytest.approx(pred["step_time_s"], rel=1e-9), (own["step_s"], pred)
    # a run from before summary.json kept its samples: the plan's means give what simulate's do
    old = tmp_path / "old"
    shutil.copytree(run.dir, old)
    (old / "summary.json").write_text(json.dumps({k: v for k, v in s.items() if k != "cost_samples"}))
    r = ppx("plan", "--from-run", str(old), "--schedules", "zb_h1", "--out", str(tmp_path / "means"))
    means = _candidate(tmp_path / "means", "zb_h1+drain")
    sim = ppx("simulate", "zb_h1", "--from-run", str(old), "--drain")
    assert f"predicted step time {means['step_s'] * 1e3:.2f} ms" in sim.stdout, (means["step_s"], sim.stdout)
    r = ppx("simulate", "zb_h1", "--from-run", str(run.dir))  # every backward split: another list
    assert "another order than this one's" in r.stdout and "theory (" in r.stdout, r.stdout
    # from a run that split every microbatch of its last stage, drain's B's there cost I + W: said
    auto = shared_run(*RUNS["llama-zb_h1-auto"], "train.steps=2")
    r = ppx("simulate", "zb_h1", "--from-run", str(auto.dir), "--drain")
    note = f"note: {auto.dir} measured no whole B on stage 1: drain's B's there cost I + W"
    assert note in r.stdout, r.stdout
    # and so do 1F1B's, in a simulation or a plan from it; not from the drain run, which measured its B's
    r = ppx("simulate", "1f1b", "--from-run", str(auto.dir))
    assert f"note: {auto.dir} measured no whole B on stage 1: 1f1b's B's there cost I + W" in r.stdout, r.stdout
    r = ppx("plan", "--from-run", str(auto.dir), "--schedules", "zb_h1,1f1b,zbv", "--out", str(tmp_path / "auto"))
    assert "no whole B on stage 1: the B's of 1f1b there cost I + W" in r.stdout, r.stdout
    own = _candidate(tmp_path / "auto", "zb_h1")
    assert own["step_s"] == pytest.approx(read_json(auto.dir / "summary.json")["predicted"]["step_time_s"], rel=1e-9)
    assert "so its I and W costs are unknown: zbv not planned" in r.stdout  # (stage 0 ran whole): two runs named,
    # and one run that measures both: the run's own beside 1F1B and a storing ZB-H1
    both = f"""`ppx run {auto.dir}/config.yaml 'run.paired=[pipeline.schedule=1f1b,"pipeline.schedule=zb_h1 train.split_backward=store"]' run.dir=null`"""
    assert f"note: one run measures both what the notes above miss: {both}" in r.stdout, r.stdout
    ran = ppx("run", *shlex.split(both.strip("`"))[2:], "train.steps=2", f"run.dir={tmp_path / 'both'}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    r = ppx("plan", "--from-run", str(tmp_path / "both"), "--schedules", "zb_h1,1f1b,zbv", "--out", str(tmp_path / "p"))
    assert "no whole B" not in r.stdout and "not planned" not in r.stdout, r.stdout
    lent = "B on stage 1 from 'pipeline.schedule=1f1b'; I and W on stage 0 from 'pipeline.schedule=zb_h1 train"
    assert lent in r.stdout, r.stdout
    # and it held 1F1B, a candidate it ran beside its own, measured against predicted
    row = read_json(tmp_path / "both" / "summary.json")["paired"]["pipeline.schedule=1f1b"]
    steps = {c["schedule"]: c["step_s"] for c in read_json(tmp_path / "p" / "plan.json")["candidates"]}
    told = f"1f1b ('pipeline.schedule=1f1b') measured {row['over_run']:.3f}x"
    assert told in r.stdout and f"predicted {steps['1f1b'] / steps['zb_h1']:.3f}x" in r.stdout, r.stdout
    # a simulation's note names what its list runs of what was lent: ZB-H2 (stage 0 whole, stage 1
    # split, as the run measured them) runs none of it; 1F1B the B on stage 1
    r = ppx("simulate", "zb_h2", "--from-run", str(tmp_path / "both"))
    assert r.returncode == 0 and "no whole B" not in r.stdout and "did not measure" not in r.stdout, r.stdout
    r = ppx("simulate", "1f1b", "--from-run", str(tmp_path / "both"))
    lent_b = f"costs the run did not measure, from run.paired beside it in {tmp_path / 'both'}: B on stage 1 from 'pipeline.schedule=1f1b'"
    assert r.returncode == 0 and lent_b in r.stdout and "I and W on stage 0" not in r.stdout, r.stdout
    r = ppx("simulate", "1f1b", "--from-run", str(run.dir))
    assert r.returncode == 0 and "no whole B" not in r.stdout, r.stdout
    # a drain run at m = p ran every W after its stage's last forward: no whole B there either, and said why
    kept = shared_run(*RUNS["llama-zb_h1-drain"], "train.steps=2", "pipeline.microbatches=2", "train.batch_size=8")
    r = ppx("simulate", "1f1b", "--from-run", str(kept.dir))
    beside = f"one run measures both, the run's own beside 1F1B: `ppx run {kept.dir}/config.yaml 'run.paired=[pipeline.schedule=1f1b]'"
    assert "cost included, where a whole backward costs less; " + beside in r.stdout, r.stdout
    # an auto run at m = p: drain would keep it as it ran, so the note names a 1F1B run instead
    even = shared_run(*RUNS["llama-zb_h1-auto"], "train.steps=2", "pipeline.microbatches=2", "train.batch_size=8")
    r = ppx("simulate", "1f1b", "--from-run", str(even.dir))
    assert f"beside 1F1B: `ppx run {even.dir}/config.yaml 'run.paired=[pipeline.schedule=1f1b]'" in r.stdout
    r = ppx("plan", "--from-run", str(kept.dir), "--schedules", "zb_h1,1f1b", "--out", str(tmp_path / "kept"))
    assert "the B's of 1f1b there cost I + W" in r.stdout and "zb_h1+drain" not in r.stdout, r.stdout
    assert "ran train.split_backward=drain: each schedule" not in r.stdout  # (no +drain candidate to speak of)
    # a plan from the drain run tries zb_h1 both ways, at the run's shape
    r = ppx("plan", "--from-run", str(run.dir), "--schedules", "zb_h1,1f1b", "-m", "4", "--out", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr
    rows = {line.split()[1] for line in r.stdout.splitlines() if line.strip()[:1].isdigit()}
    assert rows == {"zb_h1", "zb_h1+drain", "1f1b"}, r.stdout
    # every candidate's saved command runs: the drained list from a CSV of its own (no name of ppx's)
    from ppx.plan.howto import check

    plan = read_json(tmp_path / "plan" / "plan.json")
    commands = {c["schedule"]: c["command"] for c in plan["candidates"]}
    assert all(check(c) is None for c in commands.values()), commands
    drained = commands["zb_h1+drain"].split("pipeline.schedule=")[1].split()[0]
    assert drained.endswith(".csv") and (tmp_path / "plan").samefile(Path(drained).parent), commands


@pytest.mark.parametrize("way", ["stores", "graph"])
def test_a_recomputing_split_backward_holds_from_its_input_pass_to_its_weight_pass(shared_run, way):
    """Under train.recompute=full a forward keeps only its input; the I re-runs it, and the
    stage holds that forward's stores (or its graph) until the W: the counters see those bytes
    (the re-run forward's saved tensors, counted at the I), the share an I frees is negative,
    and the walk holds them to the W as the run did."""
    s = read_json(shared_run(*RUNS[f"transformer-zb_h1-recompute-{way}"], "train.steps=2").dir / "summary.json")
    assert {v["mode"] for v in s["split_backward"].values()} == {"store" if way == "stores" else "graph"}
    kept = s["saved_bytes_per_microbatch"]
    assert all(share < -10 for share in s["input_freed_share"]), (kept, s["input_freed_share"])
    for row in s["ranks"]:  # a rank holds at least one microbatch from its I to its W
        held = (1 - s["input_freed_share"][row["rank"]]) * kept[row["rank"]]
        assert row["peak_activation_bytes"] >= held, row
        assert row["predicted_peak_activation_bytes"] == pytest.approx(row["peak_activation_bytes"], rel=0.05), row


def test_a_selectively_recomputed_forward_stores_nothing(shared_run):
    """Under train.recompute=selective the I re-runs the forward, and that re-run stores what W
    needs: the first forward keeps what selective keeps (its input, the matmuls' outputs) and
    no layer input besides, the bytes of a stage that keeps its graph (it kept them too, from
    F to I: 1.12 and 1.32 MB a microbatch on llama-tiny's stages against 0.73 and 0.89)."""
    got = {
        way: read_json(shared_run(*RUNS[f"llama-zb_h1-selective-{way}"], "train.steps=2").dir / "summary.json")
        for way in ("stores", "graph")
    }
    assert {v["mode"] for v in got["stores"]["split_backward"].values()} == {"store"}
    assert got["stores"]["saved_bytes_per_microbatch"] == got["graph"]["saved_bytes_per_microbatch"]
    assert got["stores"]["losses"] == got["graph"]["losses"]
    for stores, graph in zip(got["stores"]["ranks"], got["graph"]["ranks"]):  # the stores hold less from I to W
        assert stores["peak_activation_bytes"] <= graph["peak_activation_bytes"]


def test_store_keeps_the_graph_of_a_stage_without_linear_layers(shared_run):
    """train.split_backward=store on a stage of the embedding alone: nothing to store, so that
    stage keeps its graph (summary.json says why) and the rest store; the run completes (it
    was refused at build, which failed plans' commands and calibration runs that cut a model
    so)."""
    s = read_json(shared_run(*RUNS["llama-zb_h1-store-embedding-alone"], "train.steps=2").dir / "summary.json")
    assert s["split_backward"]["0"] == {"mode": "graph", "why": "no Linear layers to store"}, s["split_backward"]
    assert s["split_backward"]["1"]["mode"] == "store"
