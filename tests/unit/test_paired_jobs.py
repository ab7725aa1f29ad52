"""Repeated ``run.paired`` jobs of one config pooled (ppx.measure.paired_jobs): a geometric mean
of the jobs' ratios with a Student-t interval over jobs, which must cover the truth as often
as it says, with few jobs as with many."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from ppx.measure.paired import said
from ppx.measure.paired_jobs import pool, pooled_rows, t975


def test_t_quantiles_match_the_table_and_the_normal_far_out():
    assert t975(1) == 12.706 and t975(4) == 2.776 and t975(30) == 2.042
    assert t975(31) == pytest.approx(2.0395, abs=2e-4)
    assert t975(60) == pytest.approx(2.0003, abs=2e-4)
    assert t975(10**6) == pytest.approx(1.95997, abs=1e-4)
    assert all(t975(d) > t975(d + 1) for d in range(1, 200))


def test_one_job_pools_nothing():
    assert pool([1.03]) is None and pool([]) is None


@pytest.mark.parametrize("jobs", [2, 3, 5, 12])
def test_the_pooled_interval_covers_the_true_ratio_95_times_in_100(jobs):
    """Jobs whose ratios scatter log-normally about 1.02 (2% between jobs): the interval holds
    1.02 in 95% of 4000 draws (a normal quantile in place of t would cover 81% with 3 jobs, 70% with 2),
    and the pooled ratio is their geometric mean."""
    rng = random.Random(jobs)
    covered = 0
    for _ in range(4000):
        ratios = [1.02 * math.exp(rng.gauss(0, 0.02)) for _ in range(jobs)]
        mean, (lo, hi) = pool(ratios)
        assert mean == pytest.approx(math.exp(sum(map(math.log, ratios)) / jobs))
        covered += lo <= 1.02 <= hi
    assert 0.93 < covered / 4000 < 0.97


def _job(floor: float, zb: float, zb_ci: tuple, floor_ci=(0.99, 1.02)) -> dict:
    return {
        "pipeline.schedule=1f1b": {"over_run": floor, "over_run_ci95": list(floor_ci), "floor": True},
        "pipeline.schedule=zb_h1": {
            "over_run": zb * floor,
            "over_floor": zb,
            "over_floor_ci95": list(zb_ci),
            "floor_entry": "pipeline.schedule=1f1b",
        },
    }


def test_entries_pool_against_the_floor_and_jobs_that_disagree_are_named():
    rows = pooled_rows([_job(1.01, 1.03, (1.02, 1.04)), _job(0.995, 0.99, (0.98, 1.00)), _job(1.0, 1.01, (1.0, 1.02))])
    zb = rows["pipeline.schedule=zb_h1"]
    assert zb["against"] == "floor" and zb["per_job"] == [1.03, 0.99, 1.01] and zb["jobs"] == 3
    assert zb["over_pooled"] == pytest.approx((1.03 * 0.99 * 1.01) ** (1 / 3))
    assert said(zb, "pooled") == "not told apart"  # each job told apart, two of them opposite ways
    assert zb["jobs_differ"] is True
    floor = rows["pipeline.schedule=1f1b"]
    assert floor["floor"] is True and floor["against"] == "run" and floor["per_job"] == [1.01, 0.995, 1.0]
    assert floor["jobs_differ"] is False  # each job's ratio inside the others' intervals


def test_jobs_that_agree_give_a_verdict_and_a_job_without_a_floor_pools_over_the_run():
    rows = pooled_rows([_job(1.0, r, (r - 0.01, r + 0.01)) for r in (1.030, 1.032, 1.028, 1.031)])
    zb = rows["pipeline.schedule=zb_h1"]
    lo, hi = zb["over_pooled_ci95"]
    assert 1.0 < lo < 1.03 < hi and said(zb, "pooled") == "slower" and zb["jobs_differ"] is False
    old = {"pipeline.schedule=zb_h1": {"over_run": 1.03, "over_run_ci95": [1.0, 1.05]}}
    mixed = pooled_rows([_job(1.0, 1.03, (1.0, 1.05)), {**_job(1.0, 1.0, (1.0, 1.0)), **old}])
    assert mixed["pipeline.schedule=zb_h1"]["against"] == "run"  # not every job had a floor
    assert mixed["pipeline.schedule=zb_h1"]["per_job"] == [1.03, 1.03]


def test_runs_of_two_sweeps_are_named_apart_in_notes():
    from ppx.report.compare_notes import note_names

    rows = [{"name": f"/r/x/sweep-{s}/repeat={k}", "label": f"repeat={k}"} for s in (1, 2) for k in (1, 2)]
    assert note_names(rows) == ["sweep-1/repeat=1", "sweep-1/repeat=2", "sweep-2/repeat=1", "sweep-2/repeat=2"]
    assert note_names(rows[:2]) == ["repeat=1", "repeat=2"]  # apart already: their labels


def _simulated_job(rng: random.Random, center: float, pairs: int = 40) -> dict:
    """One job's paired row as paired_summary makes it: the median of ``pairs`` step ratios
    scattered 3% about ``center``, and its distribution-free interval."""
    from ppx.measure.paired import median_interval

    ratios = [center * math.exp(rng.gauss(0, 0.03)) for _ in range(pairs)]
    return {"e": {"over_run": statistics.median(ratios), "over_run_ci95": list(median_interval(ratios))}}


def test_jobs_differ_only_where_two_jobs_intervals_part():
    """Groups of 8 identical jobs are flagged rarely (a rule that flags a job's ratio outside
    another job's interval flagged most of them); a group with one job 6% off is flagged."""
    rng = random.Random(5)
    same = sum(pooled_rows([_simulated_job(rng, 1.0) for _ in range(8)])["e"]["jobs_differ"] for _ in range(400))
    off = sum(
        pooled_rows([_simulated_job(rng, 1.06)] + [_simulated_job(rng, 1.0) for _ in range(7)])["e"]["jobs_differ"]
        for _ in range(400)
    )
    assert same / 400 < 0.15 and off / 400 > 0.7


def test_the_pooled_note_says_what_it_pooled_and_what_it_could_not():
    from ppx.report.compare_notes import pooled_notes

    jobs = [_job(1.0, 1.03, (1.02, 1.04)), _job(1.0, 0.99, (0.98, 1.00))]
    note = pooled_notes([([0, 1], pooled_rows(jobs))], ["a", "b"], ["1234567aaa", "1234567aaa"])[0]
    assert note.startswith("note: 2 jobs of one config and run.paired (a, b)")
    assert "'pipeline.schedule=zb_h1' (over the floor's) 1.030, 0.990: pooled " in note
    assert "'pipeline.schedule=1f1b' (the run's own config: the floor, over the run's) 1.000, 1.000" in note
    assert "'pipeline.schedule=zb_h1': two jobs' own intervals do not overlap" in note and "commits" not in note
    # a job without a floor: the others are held against the run's, and the note says why
    old = {"pipeline.schedule=1f1b": {"over_run": 1.0}, "pipeline.schedule=zb_h1": {"over_run": 1.02}}
    note = pooled_notes([([0, 1, 2], pooled_rows([*jobs, old]))], ["a", "b", "c"], ["1234567a", "7654321b", None])[0]
    assert "'pipeline.schedule=zb_h1' (over the run's: 1 of the jobs name no floor) 1.030, 0.990, 1.020" in note
    assert "the jobs were made by 2 ppx commits (1234567, 7654321)" in note
