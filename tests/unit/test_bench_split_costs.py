"""bench/split_costs.py: a stage's split costs in one process, order alternated."""

from __future__ import annotations

import pytest

from bench.split_costs import measure, rows


def test_measure_times_both_ways_of_a_stage():
    got = measure("transformer (hidden 64, 8 blocks)", "fp32", 1, steps=1, warmup_steps=0)
    med = got["median_s"]
    assert set(med) == {"F", "B", "Fs", "I", "W"} and all(v > 0 for v in med.values())
    assert got["iw_over_b"] == pytest.approx((med["I"] + med["W"]) / med["B"])
    assert got["microbatch_ratio"] == pytest.approx((med["Fs"] + med["I"] + med["W"]) / (med["F"] + med["B"]))


def _stage(iw: float) -> dict:
    ms = {"F": 1e-3, "B": 2e-3, "Fs": 1.1e-3, "I": 1.5e-3, "W": 2e-3 * iw - 1.5e-3}
    return {"median_s": ms, "iw_over_b": iw, "microbatch_ratio": 1.0, "steps": 7}


def test_a_row_passes_only_when_every_stage_is_within_the_target():
    (ok,), (miss,) = (
        rows({"m fp32": {"0": _stage(1.02), "1": _stage(1.10)}}),
        rows({"m fp32": {"0": _stage(1.02), "1": _stage(1.11)}}),
    )
    assert ok[3] == "pass" and miss[3] == "MISS"
    assert ok[1].startswith("1.020, 1.100") and "median of 7 steps" in ok[0]
