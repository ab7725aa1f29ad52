"""Measurement against exact theory on the known-cost model, memory counts, traces and the
merged timeline (real torchrun runs on gloo)."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers import CUDA_DEVICES, GPU_ENV, ppx, read_json, read_jsonl
from helpers.run import PROFILED_1F1B

# The known-cost runs here are measured against theory beside other tests: their costs are
# slept, and a woken rank takes its CPU back from a busy neighbour (2026-11-27, beside a loop of
# the suite's own multi-process tests: bubbles within 0.002 of theory, compute within 0.7%,
# step/ideal 1.009). Marked `timing` (run alone): what a neighbour did move, the ranks' common
# start in the profiler test, and the GPU tests, never measured beside one.

# 60/120 ms: the hand-offs between ranks (0.3-3 ms each on loopback gloo on a shared 2-core
# machine whose caches go cold while the ranks wait) stay small next to them
T_F, T_B = 0.060, 0.120
KNOWN_COST = [
    "model.kind=synthetic",
    f"model.fwd_ms={T_F * 1e3:g}",
    f"model.bwd_ms={T_B * 1e3:g}",
    "model.hidden=16",
    "model.layers=4",
    "train.batch_size=64",
    "train.steps=3",
]
HIDDEN, BATCH = 16, 64


def known_cost_run(tmp_path_factory, schedule, p, m, *extra, env=None, out=None):
    """The run's folder; ``out`` (a list) gets the finished process."""
    d = tmp_path_factory.mktemp("kc") / f"{schedule}_p{p}"
    r = ppx(
        "run",
        "gpipe_4gpu",
        *KNOWN_COST,
        f"pipeline.schedule={schedule}",
        f"pipeline.stages={p}",
        f"pipeline.microbatches={m}",
        f"run.dir={d}",
        *extra,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    if out is not None:
        out.append(r)
    return d


def test_a_sweep_across_schedules_compares_them_at_equal_work(tmp_path):
    """1F1B (2 layers a stage) and interleaved 1F1B with v=2 (1 layer a stage) on 2 ranks, the
    costs per layer (the sweep's default across schedules): the same work per rank, ideal and
    measured, the steps apart only by their bubbles."""
    f, b, m, layers = 0.010, 0.020, 4, 4
    r = ppx(
        "sweep",
        "gpipe_2cpu",
        "--sweep",
        "pipeline.schedule=1f1b,interleaved_1f1b",
        "model.kind=synthetic",
        f"model.fwd_ms={f * 1e3:g}",
        f"model.bwd_ms={b * 1e3:g}",
        f"model.layers={layers}",
        "model.hidden=16",
        f"pipeline.microbatches={m}",
        "train.steps=3",
        f"run.root={tmp_path}",
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ppx sweep: model.cost_per=layer: the points vary pipeline.schedule" in r.stdout
    (sweep,) = (tmp_path / "gpipe_2cpu").glob("sweep-*")
    s = {name: read_json(sweep / f"schedule={name}" / "summary.json") for name in ("1f1b", "interleaved_1f1b")}
    busy = m * layers // 2 * (f + b)  # per rank: m microbatches through half the layers
    for name, bubble in (("1f1b", 1 / 5), ("interleaved_1f1b", 1 / 9)):  # (p-1)/(m+p-1), (p-1)/(vm+p-1)
        assert "cost_per: layer" in (sweep / f"schedule={name}" / "config.yaml").read_text()
        assert s[name]["bubble_fraction_theory"] == pytest.approx(bubble)
        assert s[name]["ideal_step_time_s"] * (1 - bubble) == pytest.approx(busy)
        for rank in s[name]["ranks"]:
            assert rank["compute_s"] == pytest.approx(busy, rel=0.08)
    assert s["interleaved_1f1b"]["losses"] == pytest.approx(s["1f1b"]["losses"], rel=1e-6)


# one case per schedule family: naive on 2 ranks (m = 1, a first and a last stage), GPipe and
# 1F1B on 4 (first, middle and last stages; the tests below read these two runs too)
CASES = [("naive", 2, 1), ("gpipe", 4, 8), ("1f1b", 4, 8)]
COUNTED_EVERY_STEP = ("gpipe", 4, 8)  # its saved bytes counted in every step; the others' in the first only


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pictured = ("1f1b", 4, 8)  # test_timeline_is_chrome_trace_with_a_track_per_rank_and_flows reads its PNG
    extra = {pictured: ["logging.report=true"], COUNTED_EVERY_STEP: ["instrument.memory_steps=0"]}
    return {case: known_cost_run(tmp_path_factory, *case, *extra.get(case, [])) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[f"{s}-p{p}" for s, p, _ in CASES])
def test_measured_bubble_matches_theory_on_known_costs(runs, case):
    schedule, p, m = case
    s = read_json(runs[case] / "summary.json")
    theory = (p - 1) / p if schedule == "naive" else (p - 1) / (m + p - 1)
    assert s["bubble_fraction_theory"] == pytest.approx(theory)
    assert s["bubble_fraction"] == pytest.approx(theory, abs=0.04), s
    assert s["bubble_over_ideal_theory"] == pytest.approx(theory / (1 - theory))
    assert s["bubble_theory_basis"].startswith("simulated at the known-cost model's per-stage costs")
    assert s["ideal_step_time_s"] == pytest.approx(
        (m + p - 1) * (T_F + T_B) if schedule != "naive" else p * (T_F + T_B)
    )
    # the 1.03 target is a benchmark row (make bench); here a margin a mismeasured step breaks
    assert 1.0 <= s["step_time_over_ideal"] < 1.2
    for r in s["ranks"]:
        # each rank computes m forwards and m backwards of known length
        assert r["compute_s"] == pytest.approx(m * (T_F + T_B), rel=0.08)
        assert r["transfer_s"] <= r["wait_s"]
    per_step = read_jsonl(runs[case] / "metrics.jsonl")
    assert len(per_step) == 3
    for k, line in enumerate(per_step):
        assert len(line["ranks"]) == p
        assert {
            "compute_s",
            "comm_s",
            "post_s",
            "transfer_s",
            "wait_s",
            "idle_s",
            "bubble_fraction",
            "peak_inflight_microbatches",
            "peak_memory_bytes",
        } <= set(line["ranks"][0])
        # saved bytes: counted in the first step (instrument.memory_steps=1), or in every one
        counted = k == 0 or case == COUNTED_EVERY_STEP
        assert ("peak_activation_bytes" in line["ranks"][0]) == counted
        assert line["bubble_fraction_theory"] == pytest.approx(theory)
        assert line["bubble_over_ideal_theory"] == pytest.approx(theory / (1 - theory))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_microbatches_in_flight_and_saved_bytes(runs, schedule):
    p, m = 4, 8
    s = read_json(runs[(schedule, p, m)] / "summary.json")
    mb_bytes = (BATCH // m) * HIDDEN * 4  # the first and middle stages keep their input per microbatch
    for r in s["ranks"]:
        expect = m if schedule == "gpipe" else min(p - r["rank"], m)
        assert r["peak_inflight_microbatches"] == expect
        if r["rank"] < p - 1:
            assert r["peak_activation_bytes"] == expect * mb_bytes
        assert r["predicted_peak_activation_bytes"] == r["peak_activation_bytes"]  # the schedule walked
        assert r["peak_memory_bytes"] > 50 * 2**20  # a resident set: torch alone is more


def test_saved_bytes_counted_in_every_step_are_the_first_steps_again(runs):
    """With fixed shapes a step saves what the first saved: the run counting every step has
    the same bytes in each, and the microbatches in flight are counted in every step either way."""
    for case in (COUNTED_EVERY_STEP, ("1f1b", 4, 8)):
        lines = read_jsonl(runs[case] / "metrics.jsonl")
        for r in range(4):
            assert len({line["ranks"][r]["peak_inflight_microbatches"] for line in lines}) == 1
            counted = [line["ranks"][r].get("peak_activation_bytes") for line in lines]
            if case == COUNTED_EVERY_STEP:
                assert counted[0] > 0 and counted == [counted[0]] * 3
                assert len({str(line["ranks"][r]["saved_bytes_per_microbatch"]) for line in lines}) == 1
            else:
                assert counted[0] > 0 and counted[1:] == [None, None]


def test_saved_bytes_on_the_last_stage_follow_microbatches_in_flight(runs):
    """GPipe holds all 8 microbatches on the last stage, 1F1B one: 8x the bytes (input,
    output and target per microbatch, whatever the loss keeps)."""
    last = [read_json(runs[(s, 4, 8)] / "summary.json")["ranks"][3]["peak_activation_bytes"] for s in ("gpipe", "1f1b")]
    assert last[1] > 0 and last[0] == 8 * last[1]


def test_timeline_is_chrome_trace_with_a_track_per_rank_and_flows(runs):
    d = runs[("1f1b", 4, 8)]
    trace = json.loads((d / "timeline.json").read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r} (stage {r})" for r in range(4)}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1, 2, 3}
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in slices)
    assert {e["args"]["step"] for e in slices} == {0, 1, 2}  # all 3 steps (instrument.timeline_steps=5)
    computes = [e["name"] for e in slices if e["cat"] == "compute" and e["args"]["step"] == 2]
    assert sorted(computes) == sorted(f"{s}{op}{i}" for s in range(4) for op in "FB" for i in range(8))
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == finishes.keys()
    # every hand-off: 3 boundaries x 8 microbatches x (activation + gradient) x 3 steps
    assert len(starts) == 3 * 8 * 2 * 3
    for i, s in starts.items():
        f = finishes[i]
        assert abs(f["pid"] - s["pid"]) == 1 and f["ts"] >= s["ts"]
    assert (d / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profiler_off_writes_no_trace(runs):
    assert not list((runs[("gpipe", 4, 8)] / "tb").glob("*.pt.trace.json"))


@pytest.mark.timing  # ranks start each step together within 1%: not beside a busy neighbour
def test_profiler_traces_per_rank(shared_run):
    d = shared_run(*PROFILED_1F1B).dir  # read only: test_logging.py's TensorBoard and W&B tests read it too
    traces = sorted((d / "tb").glob("*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["rank0", "rank1"]
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    for t in traces:
        assert t.name.endswith(".pt.trace.json")
        events = [e for e in json.loads(t.read_text())["traceEvents"] if e.get("ph") == "X"]
        labels = {e["name"] for e in events}
        rank = int(t.name[4])
        assert f"PP:{rank}F0" in labels and f"PP:{rank}B3" in labels
        # ProfilerStep#N is ppx's step N (wait 1, warmup 1: steps 2 and 3 recorded), as long as
        # this rank's own timed step in metrics.jsonl, and holds no collective of its thread
        steps = {int(e["name"].split("#")[1]): e for e in events if e["name"].startswith("ProfilerStep#")}
        assert sorted(steps) == [2, 3]
        for n, e in steps.items():
            assert e["dur"] / 1e6 == pytest.approx(lines[n]["ranks"][rank]["step_s"], rel=0.05)
            inside = {
                x["name"]
                for x in events
                if x["tid"] == e["tid"] and e["ts"] <= x["ts"] < e["ts"] + e["dur"] and x["name"].startswith("c10d::")
            }
            assert inside <= {"c10d::send", "c10d::recv_"}, inside  # the pipeline's own hand-offs only
        # what ppx does between steps is named, and the records' gather runs in a thread of its own
        assert {"ppx:prepare", "ppx:align_start", "ppx:optimizer", "ppx:step_metrics"} <= labels
        gathers = [e for e in events if e["name"] == "ppx:gather_records"]
        assert gathers and {e["tid"] for e in gathers}.isdisjoint({e["tid"] for e in steps.values()})
        assert ("ppx:report" in labels) == (rank == 0)
    # the step: from the earliest start to the latest end; ranks start together (the first step
    # too: its start waits for the last rank's set-up), so it is the longest rank's own step, to
    # 1% in the median (one step may catch a busy core's wake-up, 0.2-1 ms on 2 cores; that the
    # first step waits for the last rank, tests/dist/test_clock.py checks exactly)
    late = [x["step_time_s"] - max(r["step_s"] for r in x["ranks"]) for x in lines]
    assert min(late) >= 0 and statistics.median(late) <= 0.01 * statistics.median(x["step_time_s"] for x in lines)


def test_timers_off_still_measures_step_time(tmp_path_factory):
    out = []
    d = known_cost_run(tmp_path_factory, "gpipe", 2, 4, "instrument.timers=false", "instrument.memory=false", out=out)
    s = read_json(d / "summary.json")
    assert s["step_time_s"] > 0 and "bubble_fraction" not in s
    assert not (d / "timeline.json").exists()
    # instrument.timeline is on (its default): the run says why there is none
    assert "instrument.timers=false: no per-action times, so no bubble, timeline" in out[0].stdout


@pytest.mark.timing
@pytest.mark.skipif(CUDA_DEVICES == 0, reason="needs a CUDA GPU")
def test_cuda_event_timers(tmp_path_factory):
    d = known_cost_run(
        tmp_path_factory,
        "gpipe",
        1,
        4,
        "runtime.device=cuda",
        "profile.enabled=true",
        "profile.wait=0",
        "profile.warmup=1",
        "profile.active=1",
        env=GPU_ENV,
    )
    s = read_json(d / "summary.json")
    assert s["device"].startswith("cuda") and s["backend"] == "nccl"
    (r,) = s["ranks"]
    assert r["compute_s"] == pytest.approx(4 * (T_F + T_B), rel=0.1)  # GPU spins timed by CUDA events
    assert 0 < r["peak_memory_bytes"] < 2**30  # torch.cuda.max_memory_allocated: the stage's own tensors
    (trace,) = (d / "tb").glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)  # the GPU's side, not only the host's
    assert any(e.get("name") == "PP:0F0" for e in events)


@pytest.mark.timing
@pytest.mark.skipif(CUDA_DEVICES == 0, reason="needs a CUDA GPU")
def test_watchdog_follows_a_real_gpu(tmp_path_factory):
    """The host queues the step and waits at its end while the GPU spins: each 3 s forward
    is progress under a 5 s limit, and a 12 s one is a hang named by the action on the GPU."""
    fine = known_cost_run(
        tmp_path_factory,
        "gpipe",
        1,
        2,
        "runtime.device=cuda",
        "runtime.timeout_s=5",
        "model.fwd_ms=3000",
        "model.bwd_ms=10",
        "train.steps=1",
        env=GPU_ENV,
    )
    assert read_json(fine / "summary.json")["status"] == "completed"
    d = tmp_path_factory.mktemp("kc") / "stuck"
    r = ppx(
        "run",
        "gpipe_4gpu",
        *KNOWN_COST,
        "pipeline.stages=1",
        "pipeline.microbatches=2",
        "runtime.device=cuda",
        "runtime.timeout_s=5",
        "model.fwd_ms=12000",
        "train.steps=1",
        f"run.dir={d}",
        env=GPU_ENV,
    )
    assert r.returncode != 0
    assert "the GPU is on 0F0" in r.stderr, r.stderr[-2000:]
