"""Repeated ``run.paired`` jobs of one config, pooled. One job's interval (`median_interval`)
says how its own steps spread; it cannot say how far the next job of the same config lands,
and on a shared machine two jobs differ by more than either's interval (a list's ratio moved
by 3% between jobs on this project's VMs, where each job's interval was 2% wide). So each job
is one observation: its median ratio per entry (over the floor's where every job has a
floor, else over the run's), and the pooled ratio is their geometric mean with a 95% Student-t
interval of the jobs' log ratios, which widens as honestly as few jobs deserve."""

from __future__ import annotations

import math
import statistics

# Student's t, two-sided 95% (0.975 quantile), for 1..30 degrees of freedom
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
T975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t 0.975 quantile with ``df`` degrees of freedom (a table to 30, then the
    Cornish-Fisher expansion about the normal's 1.96, within 0.001 there)."""
    if df < 1:
        raise ValueError(f"t975: {df} degrees of freedom (1 or more)")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def pool(ratios: list[float]) -> tuple[float, tuple[float, float]] | None:
    """(the geometric mean of ``ratios``, one per job, and its 95% interval: Student's t on
    their logs), or None below two jobs (one job cannot say how jobs spread)."""
    n = len(ratios)
    if n < 2 or any(r <= 0 for r in ratios):
        return None
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def pooled_rows(jobs: list[dict]) -> dict:
    """``jobs``: each job's ``paired`` summary (`ppx.measure.paired.paired_summary`), one config
    and one list of entries -> per entry: ``against`` ("floor" where every job held it against
    its floor, else "run"), ``per_job`` (each job's median ratio), ``jobs``, ``over_pooled`` and
    ``over_pooled_ci95`` (`pool`), ``floor`` for the floor itself, ``floorless_jobs`` (how many
    jobs had no floor, where others had one: held against the run's), and ``jobs_differ``:
    whether two jobs' own intervals do not overlap (the jobs differ by more than one job's
    interval says; a job's ratio outside another's interval would fire on most groups of
    identical jobs, 86-94% of simulated groups of 8, where this fires on about 8%)."""
    out = {}
    for entry in jobs[0]:
        rows = [job[entry] for job in jobs]
        against = "floor" if all("over_floor" in r for r in rows) else "run"
        ratios = [r[f"over_{against}"] for r in rows]
        row = {"against": against, "per_job": ratios, "jobs": len(ratios)}
        if all(r.get("floor") for r in rows):
            row["floor"] = True
        got = pool(ratios)
        if got is not None:
            row["over_pooled"], row["over_pooled_ci95"] = got[0], list(got[1])
        floorless = sum("over_floor" not in r for r in rows if not r.get("floor"))
        if against == "run" and 0 < floorless < len(rows):
            row["floorless_jobs"] = floorless
        intervals = [ci for r in rows if (ci := r.get(f"over_{against}_ci95")) is not None]
        row["jobs_differ"] = any(a[1] < b[0] for a in intervals for b in intervals)
        out[entry] = row
    return out
