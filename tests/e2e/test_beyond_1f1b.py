"""Interleaved 1F1B, ZB-H1, the simulator and torch.distributed.pipelining as a backend,
measured on the known-cost model with t_f = t_b = t_w (real torchrun runs on gloo)."""

from __future__ import annotations

import pytest

from helpers import PICTURED_1F1B, ppx, read_json

P, M, T = 4, 8, 40  # ranks, microbatches, ms per forward / input-grad / weight-grad pass
BASE = [
    "model.kind=synthetic",
    f"model.fwd_ms={T}",
    f"model.bwd_ms={T}",
    f"model.wgrad_ms={T}",
    "model.hidden=16",
    "train.steps=4",
    f"pipeline.stages={P}",
    f"pipeline.microbatches={M}",
    "logging.wandb.mode=disabled",
]
VARIANTS = {
    "1f1b": ["pipeline.schedule=1f1b"],
    "zb_h1": ["pipeline.schedule=zb_h1"],
    # two stages per rank, each half the work: the same model cost per rank as above
    "interleaved": [
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.virtual_stages=2",
        "model.layers=8",
        f"model.fwd_ms={T // 2}",
        f"model.bwd_ms={T // 2}",
        f"model.wgrad_ms={T // 2}",
    ],
    # ppx's ZB-H1 list exported to torch's CSV form and run by torch's _PipelineScheduleRuntime
    "zb_h1_torch": ["pipeline.schedule=zb_h1", "pipeline.executor=torch"],
}
PPX_EXECUTED = [name for name in VARIANTS if not name.endswith("_torch")]


# every test that reads these runs is marked timing (the fixture runs in its first
# requester's set-up): measured idle time and the simulator's prediction of the steps
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, extra in VARIANTS.items():
        d = tmp_path_factory.mktemp("beyond") / name
        r = ppx("run", "1f1b_4gpu", *BASE, *extra, f"run.dir={d}")
        assert r.returncode == 0, r.stderr[-3000:]
        assert "ppx: predicted from measured costs: step" in r.stdout
        out[name] = read_json(d / "summary.json")
        out[name]["dir"] = d
    return out


def idle(s) -> float:
    return sum(r["idle_s"] for r in s["ranks"])


@pytest.mark.timing
def test_theory_values(runs):
    assert runs["1f1b"]["bubble_fraction_theory"] == pytest.approx((P - 1) / (M + P - 1))
    assert runs["zb_h1"]["bubble_fraction_theory"] == pytest.approx((P - 1) / (3 * M + P - 1))
    assert runs["interleaved"]["bubble_fraction_theory"] == pytest.approx((P - 1) / (2 * M + P - 1))


@pytest.mark.timing
def test_zb_h1_cuts_the_bubble_at_1f1b_peak_memory(runs):
    zb, ref = runs["zb_h1"], runs["1f1b"]
    # theory: a third of 1F1B's idle time; measured here with 0.2-0.5 ms hand-offs per action
    assert idle(zb) < 0.5 * idle(ref)
    assert max(r["peak_inflight_microbatches"] for r in zb["ranks"]) == P
    assert [r["peak_inflight_microbatches"] for r in ref["ranks"]] == [P - r for r in range(P)]
    assert zb["losses"] == pytest.approx(ref["losses"], rel=1e-6)


@pytest.mark.timing
def test_interleaved_about_halves_the_bubble(runs):
    assert idle(runs["interleaved"]) < 0.75 * idle(runs["1f1b"])
    assert runs["interleaved"]["losses"] == pytest.approx(runs["1f1b"]["losses"], rel=1e-6)


@pytest.mark.timing
@pytest.mark.parametrize("name", list(VARIANTS))
def test_simulator_predicts_the_measured_step(runs, name):
    # the 5% target is a benchmark row (make bench); here only a margin a broken simulator
    # or a mismatched cost (a missing action, a wrong stage) would break; torch's runtime too,
    # whose waits ppx's timers do not see (its overhead: the least gap between two computes)
    s = runs[name]
    assert abs(s["prediction_error"]["step_time"]) <= 0.15, s["predicted"]
    assert abs(s["prediction_error"]["bubble_fraction"]) <= 0.10
    costs = s["measured_costs"]
    assert costs["action_s"]["0F"] == pytest.approx(T / 1e3 / (2 if name == "interleaved" else 1), rel=0.1)
    if name == "zb_h1":
        assert {"0I", "0W", "3I", "3W"} <= set(costs["action_s"])


@pytest.mark.timing
def test_ppx_schedule_runs_in_torchs_runtime(runs):
    """The exported list runs in torch's runtime: same losses, same memory, I and W timed."""
    mine, ref = runs["zb_h1_torch"], runs["zb_h1"]
    assert mine["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert [r["peak_inflight_microbatches"] for r in mine["ranks"]] == [
        r["peak_inflight_microbatches"] for r in ref["ranks"]
    ]
    # from I to W torch holds the graph and the output gradient, as ppx's graph way does, and
    # more (the input's gradient, the gradients at the intermediates its W starts from)
    shares = zip(mine["input_freed_share"], ref["input_freed_share"])
    assert all(t <= r + 1e-9 for t, r in shares) and min(mine["input_freed_share"]) < -1, mine["input_freed_share"]
    costs = mine["measured_costs"]["action_s"]
    assert {"0I", "0W", "3I", "3W"} <= set(costs)
    # torch's first stage skips its I and runs the whole backward in its W; the others split
    assert costs["0I"] < 0.1 * T / 1e3 and costs["0W"] == pytest.approx(2 * T / 1e3, rel=0.1), costs
    assert costs["3I"] == pytest.approx(T / 1e3, rel=0.1) and costs["3W"] == pytest.approx(T / 1e3, rel=0.1), costs
    assert mine["bubble_fraction_theory"] == pytest.approx(ref["bubble_fraction_theory"])


@pytest.mark.timing
def test_simulate_from_a_run(runs):
    d = runs["zb_h1"]["dir"]
    r = ppx("simulate", "zb_h1", "-p", str(P), "-m", str(M), "--from-run", str(d))
    assert r.returncode == 0, r.stderr
    assert "predicted step time" in r.stdout and f"measured in {d}: step" in r.stdout
    r = ppx("simulate", "1f1b", "--from-run", str(d))  # the known-cost model's I + W is its B: nothing to say
    assert r.returncode == 0 and "no whole B" not in r.stdout, r.stdout
    r = ppx("simulate", "1f1b", "-p", "4", "-m", "8", "--fwd-ms", "10", "--bwd-ms", "20")
    p, m, slot = 4, 8, 10 + 20  # no hand-off costs: (m + p - 1) slots of F + B, idle (p-1)/(m+p-1)
    assert f"predicted step time {(m + p - 1) * slot:.2f} ms, bubble {(p - 1) / (m + p - 1):.1%}" in r.stdout


def test_torch_backend_runs_in_the_harness_with_the_same_losses(shared_run, tmp_path):
    a = shared_run(*PICTURED_1F1B)  # the experiment's schedule: 1f1b
    b = ppx("run", "1f1b_2cpu", "train.steps=3", "pipeline.schedule=torch_1f1b", f"run.dir={tmp_path / 'torch'}")
    assert b.returncode == 0, b.stderr[-3000:]
    sa, sb = read_json(a.dir / "summary.json"), read_json(tmp_path / "torch" / "summary.json")
    assert sa["schedule"] == "1f1b"
    assert sb["losses"] == sa["losses"]  # (bit for bit: each microbatch's loss scaled by 1/m, as ppx's runtime does)
    p, m = sa["stages"], sa["microbatches"]
    assert sb["schedule"] == "torch_1f1b" and sb["bubble_fraction_theory"] == pytest.approx((p - 1) / (m + p - 1))
    assert all(r["compute_s"] > 0 for r in sb["ranks"])  # ppx's timers around torch's actions
    assert [r["peak_inflight_microbatches"] for r in sb["ranks"]] == [2, 1]
    # saved bytes count alike under both executors: the first stage's input (a view into the
    # batch under torch's split) by its own bytes, and the loss torch computes after the last
    # stage's forward as part of that forward
    assert [r["peak_activation_bytes"] for r in sb["ranks"]] == [r["peak_activation_bytes"] for r in sa["ranks"]]
    # and so do a microbatch's bytes, the loss's added to its forward's: the prediction holds
    assert sb["saved_bytes_per_microbatch"] == sa["saved_bytes_per_microbatch"]
    assert sb["memory_prediction_error"] == pytest.approx(0.0, abs=0.05)


def test_overlapped_cells_show_both_parts_in_the_timeline(shared_run):
    """DualPipeV's cells run their forward, then their backward, on CPU: the timeline holds
    both parts of every cell of the schedule, next to each other on the rank's track."""
    from ppx.schedules import registry

    # read only: test_memory_prediction.py's llama DualPipeV run (2 ranks, 4 microbatches)
    d = shared_run(
        "llama_tiny_1f1b_2cpu", "pipeline.schedule=dualpipev", "train.recompute=selective", "train.steps=2"
    ).dir
    s = read_json(d / "summary.json")
    assert (s["schedule"], len(s["ranks"]), s["microbatches"]) == ("dualpipev", 2, 4)
    sched = registry.build("dualpipev", 2, 4)
    trace = read_json(d / "timeline.json")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    last = max(e["args"]["step"] for e in events if e.get("ph") == "X")
    for rank in range(2):
        names = [e["name"] for e in events if e.get("ph") == "X" and e["pid"] == rank and e["args"]["step"] == last]
        computes = [n for n in names if n in {str(a) for a in sched.actions[rank]}]
        cells = [s for s in sched.strings(rank) if s.endswith("OVERLAP_F_B")]
        assert cells
        for cell in cells:
            f, b = cell[1:].split(")")[0].split(";")
            assert computes[computes.index(f) + 1] == b, (rank, cell)
