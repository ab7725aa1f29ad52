"""Flatten one step's metrics into named scalars, the same names for TensorBoard and W&B."""

from __future__ import annotations

from ppx.measure.metrics import PER_RANK


def step_scalars(line: dict, batch_size: int) -> dict[str, float]:
    """{"loss": .., "time/step_time_s": .., "bubble/measured": .., "compute_s/rank0": .., ...}.
    ``bubble/measured`` and ``bubble/theory`` are idle / step time, as ``bubble_fraction``; the
    ``_over_ideal`` ones idle / busy time, as ``bubble_over_ideal``."""
    out: dict[str, float] = {}
    if line.get("loss") is not None:
        out["loss"] = line["loss"]
    out["time/step_time_s"] = line["step_time_s"]
    out["time/throughput_samples_per_s"] = batch_size / line["step_time_s"]
    if line.get("bubble_fraction") is not None:
        out["bubble/measured"] = line["bubble_fraction"]
        out["bubble/measured_over_ideal"] = line["bubble_over_ideal"]
    if line.get("bubble_fraction_theory") is not None:
        out["bubble/theory"] = line["bubble_fraction_theory"]
        out["bubble/theory_over_ideal"] = line["bubble_over_ideal_theory"]
    for r in line.get("ranks", []):
        for key in PER_RANK:
            if r.get(key) is not None:
                out[f"{key}/rank{r['rank']}"] = r[key]
    return out


def run_scalars(summary: dict) -> dict[str, float]:
    """The run's own values under `step_scalars`'s names (its medians over steps, the run's
    throughput, the prediction from measured costs), for a sink's run summary, where the last
    step's would stand for the run (W&B's runs table shows a summary). The loss stays the last
    step's."""
    keys = ("step_time_s", "bubble_fraction", "bubble_over_ideal", "bubble_fraction_theory", "bubble_over_ideal_theory")
    line = {k: summary.get(k) for k in keys} | {"ranks": summary.get("ranks", [])}
    # (throughput: the batch over the median step, as summary.json's own)
    out = step_scalars(line, summary["batch_size"]) if line["step_time_s"] else {}
    pred = summary.get("predicted") or {}
    if pred.get("step_time_s") is not None:
        out["predicted/step_time_s"] = pred["step_time_s"]
    if pred.get("bubble_fraction") is not None:
        out["predicted/bubble_fraction"] = pred["bubble_fraction"]
    return out
