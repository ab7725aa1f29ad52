"""`make bench`'s order check for the planner rows (bench/plan_check.py): which out-of-order
pairs fail it and which it reports as ties or as pairs the plan named too close to call."""

from __future__ import annotations

from bench.plan_check import _order


def row(median: float, low: float, high: float, named_close: bool = False) -> dict:
    return {"measured_step_s": median, "measured_range_s": (low, high), "named_close": named_close}


def test_the_predicted_order_measured_is_strict_and_has_no_pairs():
    strict, pairs = _order([row(1.0, 0.99, 1.01), row(1.1, 1.09, 1.11), row(1.2, 1.19, 1.21)])
    assert strict and pairs == {"wrong": [], "tied": [], "called_close": []}


def test_an_out_of_order_pair_whose_runs_overlap_is_tied():
    strict, pairs = _order([row(1.02, 1.00, 1.03), row(1.01, 1.00, 1.02), row(1.2, 1.19, 1.21)])
    assert not strict and pairs == {"wrong": [], "tied": [(0, 1)], "called_close": []}


def test_runs_apart_fail_unless_the_plan_named_the_second_close_to_the_best():
    apart = [row(1.05, 1.04, 1.06), row(1.00, 0.99, 1.01), row(1.2, 1.19, 1.21)]
    assert _order(apart)[1]["wrong"] == [(0, 1)]
    apart[1]["named_close"] = True
    assert _order(apart)[1] == {"wrong": [], "tied": [], "called_close": [(0, 1)]}


def test_the_plan_claims_no_order_only_against_the_best():
    # the second and third swap, runs apart: the plan's note names candidates close to the best only
    rows = [row(1.0, 0.99, 1.01), row(1.15, 1.14, 1.16, True), row(1.05, 1.04, 1.06, True)]
    assert _order(rows)[1] == {"wrong": [(1, 2)], "tied": [], "called_close": []}
