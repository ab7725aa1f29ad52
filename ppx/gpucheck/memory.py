"""Memory: each rank's peak allocated bytes (``torch.cuda.max_memory_allocated`` over a step,
optimizer step included) against the memory model's prediction: the rank's weights, their
gradients and the optimizer's state (``param_bytes`` x (2 + state per weight: SGD 0, AdamW
2)), plus its peak saved activations walked from the schedule (``predicted_peak_activation_
bytes``, from the bytes one microbatch saves per stage).

Runs: GPipe (every microbatch in flight at the peak, where the model is plainest) on the
transformer (hidden 1024, 4 blocks a rank, a 2048-token vocabulary, 16 sequences of 512
tokens a microbatch) and on llama-tiny (64 sequences of 256 tokens a microbatch), 8
microbatches, at p = min(GPUs, 4); SGD, fp32, 3 steps. About 10 and 6 GiB a rank, so that what
the model leaves out or adds too early stays within a few percent: cuBLAS's workspaces, the
batch, a backward's transient gradients (about one microbatch's worth of a layer), and the
gradients, which the model counts but which GPipe's peak, at its first backward, has not made
yet (weights are 2% of the transformer's peak). On CPU, with the allocator's count from an
outer torch.profiler, this model held GPipe within -1.7% and +0.5% on smaller shapes of both,
where 1F1B's one microbatch in flight came out +3.3% and +8.2%."""

from __future__ import annotations

from ppx.gpucheck import sizes
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.runs import RunSpec
from ppx.gpucheck.verdict import Outcome, judged, mib, pct, skipped, table
from ppx.measure.weights_held import weights_held_bytes

NAME = "memory"
TITLE = "Peak memory against the memory model"
TOL = 0.05
MODELS = ("transformer", "llama-tiny")
CRITERIA = [
    (
        f"{model}, GPipe: peak allocated / predicted (weights + gradients + optimizer state + peak saved activations), worst rank",
        f"within {TOL:.0%}",
    )
    for model in MODELS
]


def plan(machine: Machine) -> list[RunSpec] | str:
    if not machine.cuda:
        return "needs CUDA: on CPU a rank's peak_memory_bytes is its resident set, not allocated bytes"
    p = machine.ranks(4)
    runs = {
        "memory-transformer": sizes.transformer(1024, 4 * p, 16, 512, 2048, batch=128, steps=3),
        "memory-llama-tiny": sizes.llama_tiny(256, batch=512, steps=3),
    }
    out = []
    for name, keys in runs.items():
        keys.update(sizes.pipeline("gpipe", p, 8), **{"instrument.timeline": False})
        out.append(RunSpec.of(name, keys, sizes.startup_s(p) + sizes.model_seconds(keys, p)))
    return out


def predicted_peak(rank: dict, optimizer: str) -> int | None:
    """The memory model's peak for one summary.json rank row, or None without its inputs."""
    act, params = rank.get("predicted_peak_activation_bytes"), rank.get("param_bytes")
    if act is None or params is None:
        return None
    return int(weights_held_bytes(params, optimizer) + act)


def rank_errors(summary: dict, optimizer: str) -> list[dict]:
    """Per rank: measured peak, the model's parts and prediction, and measured / predicted - 1."""
    out = []
    for r in summary["ranks"]:
        pred = predicted_peak(r, optimizer)
        measured = r.get("peak_memory_bytes")
        out.append(
            {
                "rank": r["rank"],
                "measured": measured,
                "predicted": pred,
                "param_bytes": r.get("param_bytes"),
                "activations": r.get("predicted_peak_activation_bytes"),
                "error": None if not pred or measured is None else measured / pred - 1,
            }
        )
    return out


def judge_errors(errors: list[dict]) -> tuple[float, bool, str]:
    worst = max((e for e in errors), key=lambda e: abs(e["error"]))
    figure = ", ".join(f"rank {e['rank']} {mib(e['measured'])}/{mib(e['predicted'])} MiB" for e in errors)
    return worst["error"], abs(worst["error"]) <= TOL, f"{figure} (worst {pct(worst['error'])})"


def judge(machine: Machine, runs: dict) -> Outcome:
    specs = plan(machine)
    if isinstance(specs, str):
        return Outcome([skipped(w, specs, t) for w, t in CRITERIA])
    rows, lines, data = [], [], {}
    for (what, threshold), spec in zip(CRITERIA, specs):
        run = runs[spec.name]
        errors = rank_errors(run.raw_summary, run.config.train.optimizer)
        data[spec.name] = errors
        if any(e["error"] is None for e in errors):
            rows.append(skipped(what, "the run recorded no param_bytes or predicted activations", threshold))
            continue
        rows.append(judged(what, *judge_errors(errors), threshold))
        lines.append(f"{spec.name} ({run.raw_summary['device']}):")
        lines += table(
            [
                "rank",
                "peak allocated MiB",
                "weights MiB",
                "peak saved activations MiB (predicted)",
                "predicted MiB",
                "error",
            ],
            [
                [
                    e["rank"],
                    mib(e["measured"]),
                    mib(e["param_bytes"]),
                    mib(e["activations"]),
                    mib(e["predicted"]),
                    pct(e["error"]),
                ]
                for e in errors
            ],
        )
    return Outcome(rows, lines, data)
