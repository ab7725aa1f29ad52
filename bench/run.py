"""`make bench`: the benchmark matrix in one go, written as markdown + JSON.

Every case is one torchrun job on CPU + gloo in which the variants run side by side,
alternating step by step (see bench/worker.py). Results go to docs/benchmarks.md and
bench/results.json; the markdown is printed too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.tables import markdown, this_machine, write_generated  # noqa: E402
from ppx.launch.devices import CPU_ONLY  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MLP = ["model.kind=mlp", "model.hidden=256", "model.layers=8", "train.batch_size=64", "pipeline.microbatches=8"]
MLP_LARGE = ["model.kind=mlp", "model.hidden=1024", "model.layers=8", "train.batch_size=64", "pipeline.microbatches=8"]
LLAMA_TINY = ["model.preset=llama-tiny", "model.layers=8", "train.batch_size=32", "pipeline.microbatches=8"]
KNOWN = [
    "model.kind=synthetic",
    "model.fwd_ms=10",
    "model.bwd_ms=20",
    "model.hidden=16",
    "model.layers=4",
    "train.batch_size=64",
    "pipeline.microbatches=8",
]

# the instruments' cost: none, timers, timers + memory counters as ppx run has them, counting every step
OVERHEAD = ["ppx", "ppx_timers", "ppx_all", "ppx_all_steps"]

# name -> (processes, variants, overrides, measured steps per variant at BENCH_SCALE=1)
CASES = {
    "mlp_gpipe_p4": (4, ["ppx", "torch"], MLP + ["pipeline.schedule=gpipe"], 100),
    "mlp_1f1b_p4": (4, ["ppx", "torch"], MLP + ["pipeline.schedule=1f1b"], 100),
    "mlp_1f1b_p2": (2, ["ppx", "torch"], MLP + ["pipeline.schedule=1f1b"], 100),
    "mlp_large_1f1b_p2": (2, ["ppx", "torch"], MLP_LARGE + ["pipeline.schedule=1f1b"], 60),
    "known_gpipe_p4": (4, ["ppx", "torch"], KNOWN + ["pipeline.schedule=gpipe"], 30),
    "known_1f1b_p4": (4, ["ppx", "torch"], KNOWN + ["pipeline.schedule=1f1b"], 30),
    "known_1f1b_p2": (2, ["ppx", "torch"], KNOWN + ["pipeline.schedule=1f1b"], 30),
    "overhead_known_1f1b_p4": (4, OVERHEAD, KNOWN + ["pipeline.schedule=1f1b"], 20),
    "overhead_mlp_1f1b_p2": (2, OVERHEAD, MLP + ["pipeline.schedule=1f1b"], 300),
    "overhead_mlp_large_1f1b_p2": (2, OVERHEAD, MLP_LARGE + ["pipeline.schedule=1f1b"], 30),
    # a real model's many saved tensors (169 a forward on a stage of 4 blocks): the memory counters' cost
    "overhead_llama_tiny_1f1b_p2": (2, OVERHEAD, LLAMA_TINY + ["pipeline.schedule=1f1b"], 60),
}


def run_worker(nproc: int, variants: list[str], overrides: list[str], reps: int, name: str, experiment=None) -> dict:
    """One torchrun job of bench/worker.py: ``variants`` side by side, alternating step by step,
    ``reps`` measured steps each; its JSON (``name`` names the case in a failure)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(ROOT / "bench" / "worker.py"),
            *(["--experiment", experiment] if experiment else []),
            "--variants",
            *variants,
            "--reps",
            str(reps),
            "--out",
            str(out),
            "--overrides",
            *overrides,
        ]
        # CPU ranks, which see no GPU (`CPU_ONLY`: torch's optimizer step would start CUDA in each)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **CPU_ONLY)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"bench case {name} failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def run_case(name: str, scale: float) -> dict:
    nproc, variants, overrides, reps = CASES[name]
    reps = max(3, int(reps * scale))
    t = time.time()
    result = run_worker(nproc, variants, overrides, reps, name)
    result.pop("steps_s", None)  # the medians are the case's figures
    result.update(name=name, processes=nproc, wall_s=round(time.time() - t, 1))
    print(f"  {name}: {json.dumps(result['median_step_s'])}", flush=True)
    return result


# Whole `ppx run`s (their summaries): schedules beyond 1F1B on the known-cost model with
# t_f = t_b = t_w, and the simulator's prediction error on the known-cost model and the MLP.
TW = [
    "model.kind=synthetic",
    "model.hidden=16",
    "train.steps=6",
    "pipeline.stages=4",
    "pipeline.microbatches=8",
]
RUNS = {
    "tw_1f1b": TW + ["pipeline.schedule=1f1b", "model.fwd_ms=10", "model.bwd_ms=10", "model.wgrad_ms=10"],
    "tw_zb_h1": TW + ["pipeline.schedule=zb_h1", "model.fwd_ms=10", "model.bwd_ms=10", "model.wgrad_ms=10"],
    "tw_interleaved": TW
    + [
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.virtual_stages=2",
        "model.layers=8",
        "model.fwd_ms=5",
        "model.bwd_ms=5",
        "model.wgrad_ms=5",
    ],
    # the same at 4x the cost per action: hand-offs (about 1 ms on this machine) matter 4x less
    "tw40_1f1b": TW + ["pipeline.schedule=1f1b", "model.fwd_ms=40", "model.bwd_ms=40", "model.wgrad_ms=40"],
    "tw40_zb_h1": TW + ["pipeline.schedule=zb_h1", "model.fwd_ms=40", "model.bwd_ms=40", "model.wgrad_ms=40"],
    "tw40_interleaved": TW
    + [
        "pipeline.schedule=interleaved_1f1b",
        "pipeline.virtual_stages=2",
        "model.layers=8",
        "model.fwd_ms=20",
        "model.bwd_ms=20",
        "model.wgrad_ms=20",
    ],
    # ppx's ZB-H1 list exported to torch's CSV form and executed by torch's _PipelineScheduleRuntime
    "tw_zb_h1_torch_executor": TW
    + ["pipeline.schedule=zb_h1", "pipeline.executor=torch", "model.fwd_ms=10", "model.bwd_ms=10", "model.wgrad_ms=10"],
    # every training schedule of the registry, t_f = t_b = t_w = 10 ms per stage (below)
    "mlp_1f1b_p2_run": [
        "pipeline.schedule=1f1b",
        "pipeline.stages=2",
        "pipeline.microbatches=8",
        "model.kind=mlp",
        "model.hidden=256",
        "model.layers=8",
        "train.batch_size=64",
        "train.steps=40",
        "instrument.timeline_steps=30",
    ],
    "mlp1024_1f1b_p2_run": [
        "pipeline.schedule=1f1b",
        "pipeline.stages=2",
        "pipeline.microbatches=8",
        "model.kind=mlp",
        "model.hidden=1024",
        "model.layers=8",
        "train.batch_size=64",
        "train.steps=30",
        "instrument.timeline_steps=20",
    ],
}


def every_schedule_runs() -> dict[str, list[str]]:
    """One known-cost run per training schedule at p=4, m=8, t_f = t_b = t_w = 10 ms per
    stage: its measured bubble against its theory (bench/tables.py `every_schedule_rows`)."""
    from ppx.schedules import registry

    return {
        f"every_{name}": TW
        + [f"pipeline.schedule={name}", "model.fwd_ms=10", "model.bwd_ms=10", "model.wgrad_ms=10"]
        + (["model.layers=8"] if registry.default_virtual(name) == 2 else [])
        for name in registry.FAMILIES
        if name != "forward_only"
    }


RUNS.update(every_schedule_runs())

# pipeline x data parallel on the known-cost model: pp=2 alone against pp=2 x dp=2 at the same
# per-replica batch (so the same microbatches per replica): the replicas' gradient reduction,
# each stage's after its last backward, should hide behind the other rank's drain
DP = [
    "model.kind=synthetic",
    "model.hidden=16",
    "model.layers=4",
    "model.fwd_ms=10",
    "model.bwd_ms=20",
    "pipeline.schedule=1f1b",
    "pipeline.stages=2",
    "pipeline.microbatches=8",
    "train.steps=8",
]
RUNS["dp_base_1f1b_p2"] = DP + ["train.batch_size=32"]
RUNS["dp_1f1b_p2x2"] = DP + ["train.batch_size=64", "parallel.data=2"]
# per-stage action costs and saved bytes per microbatch of the models, zb_h1 at p=2 (so B is
# measured as I and W); llama-1b's shapes (hidden 2048, ffn 8192, vocab 128256) with 2 of its
# 16 blocks and 64 tokens, what this CPU machine can hold and time
MODEL_COSTS = [
    "pipeline.schedule=zb_h1",
    "pipeline.stages=2",
    "train.steps=4",
    "instrument.timeline_steps=2",
]
RUNS["cost_mlp256_zb_h1_p2"] = MODEL_COSTS + [
    "model.kind=mlp",
    "model.hidden=256",
    "model.layers=8",
    "pipeline.microbatches=8",
    "train.batch_size=64",
]
RUNS["cost_llama_tiny_zb_h1_p2"] = MODEL_COSTS + [
    "model.kind=llama",
    "model.preset=llama-tiny",
    "pipeline.microbatches=8",
    "train.batch_size=64",
]
RUNS["cost_llama1b_2blocks_zb_h1_p2"] = MODEL_COSTS + [
    "model.kind=llama",
    "model.preset=llama-1b",
    "model.layers=2",
    "model.seq_len=64",
    "pipeline.microbatches=2",
    "train.batch_size=2",
]


def run_summary(name: str) -> dict:
    from ppx.config import SUMMARY_ONLY, as_overrides
    from ppx.report.run_dir import RunDir

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "ppx.cli",
            "run",
            "gpipe_4gpu",
            *RUNS[name],
            *as_overrides(SUMMARY_ONLY),  # only the run's JSON files are read
            f"run.dir={d}",
        ]
        proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"bench run {name} failed:\n{proc.stderr[-3000:]}")
        run = RunDir(d)
        s, raw = run.summary, run.raw_summary
    keep = (
        "step_time_s",
        "bubble_fraction",
        "bubble_fraction_theory",
        "predicted",
        "prediction_error",
        "ranks",
        "ideal_step_time_s",
        "measured_costs",
        "schedule",
        "stages",
        "microbatches",
        "virtual_stages",
        "data_parallel",
        "model",
    )
    out = {k: raw.get(k) for k in keep}  # results.json keeps summary.json's own fields
    print(f"  {name}: step {s.step_time_s * 1e3:.1f} ms, bubble {s.bubble_fraction or 0:.1%}", flush=True)
    return out


def main() -> None:
    scale = float(os.environ.get("BENCH_SCALE", "1"))
    if sys.argv[1:2] and sys.argv[1].startswith("--"):
        from bench.reruns import rerun_from_args

        return rerun_from_args(sys.argv[1:])
    only = sys.argv[1:] or list(CASES)
    print(f"ppx bench: {len(only)} cases")
    results = {name: run_case(name, scale) for name in only}
    if set(only) == set(CASES):
        from bench.micro import memory_cost_s, timer_cost_s
        from ppx.schedules import build
        from ppx.schedules.comms.program import compile_program

        items = max(len(compile_program(row, (0, 1), -1)) for row in build("1f1b", 2, 8).actions)
        results["micro"] = {
            "timer_s_per_item": timer_cost_s(),
            "memory_s_per_microbatch": memory_cost_s(MLP),
            "mlp_p2_items_per_rank": items,
            "mlp_p2_step_s": results["mlp_1f1b_p2"]["median_step_s"]["ppx"],
        }
        results["runs"] = {name: run_summary(name) for name in RUNS}
        from bench.plan_check import check_all

        results["plans"] = check_all(ROOT / "docs" / "images")  # ppx plan's top three run (bench/plan_check.py)
        from bench.split_backward import check_all as check_split

        results["split_backward"] = check_split()  # zero bubble on real models (bench/split_backward.py)
        from bench.split_backward import check_large

        results["split_large"] = check_large()  # the same where matmuls dominate (llama-1b shapes)
        from bench.split_paired import check_paired_all

        results["split_paired"] = check_paired_all()  # each zero-bubble list step by step beside 1F1B, a job each
        from bench.split_costs import check_all as check_split_costs

        results["split_costs"] = check_split_costs()  # (I + W) / B in one process, without runs' noise
        from bench.plan_printed import check_all as check_printed

        results["printed_plans"] = check_printed()  # plans run as printed; zb_auto vs the paper (issue 25)
    if set(only) == set(CASES):
        results["measured_on"] = time.strftime("%Y-%m-%d")
        results["machine"] = this_machine()
        (ROOT / "bench" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        md = markdown(results, scale)
        (ROOT / "docs").mkdir(exist_ok=True)
        write_generated(ROOT / "docs" / "benchmarks.md", md)
        print()
        print(md)


if __name__ == "__main__":
    main()
