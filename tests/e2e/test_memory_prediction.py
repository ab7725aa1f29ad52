"""`ppx run` predicts each rank's peak saved activations from the bytes one microbatch saves
per stage (the schedule walked: F adds, B and W free) and reports it next to the measured
peak: within 5% on the transformer and llama, across placements, and on the MLP under every
schedule (at p=4 under GPipe and 1F1B too: tests/e2e/test_instrumentation.py)."""

from __future__ import annotations

import pytest

from helpers import ppx, read_json
from ppx.schedules.registry import FAMILIES

RUNS = {
    "transformer-zbv": ["transformer_1f1b_2cpu", "pipeline.schedule=zbv", "pipeline.microbatches=4"],
    "llama-interleaved": [
        "llama_tiny_1f1b_2cpu",
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.virtual_stages=2",
        "pipeline.microbatches=4",
    ],
    "llama-dualpipev-recompute": ["llama_tiny_1f1b_2cpu", "pipeline.schedule=dualpipev", "train.recompute=selective"],
    # a split backward that stores: each microbatch's graph goes at its I, its stores stay to W
    "llama-zb_h1-stores-bf16": ["llama_tiny_1f1b_2cpu", "pipeline.schedule=zb_h1", "train.dtype=bf16"],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_predicted_peak_saved_bytes_match_the_measured(shared_run, name):
    # read only: test_beyond_1f1b.py reads the DualPipeV run's timeline too
    run = shared_run(*RUNS[name], "train.steps=2")
    d, r = run.dir, run.result
    s = read_json(d / "summary.json")
    assert len(s["saved_bytes_per_microbatch"]) == s["stages"] and min(s["saved_bytes_per_microbatch"]) > 0
    for row in s["ranks"]:
        assert row["predicted_peak_activation_bytes"] == pytest.approx(row["peak_activation_bytes"], rel=0.05), row
    assert abs(s["memory_prediction_error"]) <= 0.05
    assert "ppx: peak saved activations, predicted/measured MiB: rank 0 " in r.stdout


# every family with a backward (forward_only saves nothing to free)
EVERY = [name for name in FAMILIES if name != "forward_only"]


def test_every_schedule_predicts_the_mlps_peak_saved_bytes(tmp_path):
    """One sweep over every schedule on the MLP at p=2 (two stages a rank where the schedule
    takes several): each rank's predicted peak equals its measured one (the MLP's layers each
    save their own activations, so the walk is exact)."""
    r = ppx(
        "sweep",
        "gpipe_2cpu",
        "--sweep",
        "pipeline.schedule=" + ",".join(EVERY),
        "model.hidden=32",
        "pipeline.microbatches=4",
        "train.batch_size=8",
        "train.steps=1",
        "instrument.timeline=false",  # nothing here reads the timeline, TensorBoard or W&B
        "logging.tensorboard=false",
        "logging.wandb.mode=disabled",
        f"run.root={tmp_path}",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (sweep,) = (tmp_path / "gpipe_2cpu").glob("sweep-*")
    for name in EVERY:
        s = read_json(sweep / f"schedule={name}" / "summary.json")
        for row in s["ranks"]:
            assert row["peak_activation_bytes"] > 0, (name, row)
            assert row["predicted_peak_activation_bytes"] == row["peak_activation_bytes"], (name, row)


def test_a_storing_split_backward_frees_most_of_a_microbatch_at_its_input_pass(shared_run, tmp_path):
    """llama-tiny under ZB-H1 stores on both stages (auto): summary.json says so with the bytes
    that chose it, and the memory model frees at each I the share the run measured; the graph's
    way frees nothing there and holds more at the peak."""
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
    assert graph["input_freed_share"] == [0.0, 0.0]
    assert stores["saved_bytes_per_microbatch"] == graph["saved_bytes_per_microbatch"]  # the same forwards
    # ZB-H1's last rank holds p microbatches: with stores, its peak is lower
    assert stores["ranks"][1]["peak_activation_bytes"] < graph["ranks"][1]["peak_activation_bytes"]
    for s in (stores, graph):
        assert abs(s["memory_prediction_error"]) <= 0.05
