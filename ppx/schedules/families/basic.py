"""The single-stage-per-rank schedules: naive, GPipe, 1F1B and forward-only.

Each is a pure function of (stages p, microbatches m) returning a compute-only `Schedule`
in which rank r owns stage r.
"""

from __future__ import annotations

from ppx.schedules.ir.action import B, F
from ppx.schedules.ir.schedule import Schedule


def _one_stage_per_rank(name: str, m: int, rows, training: bool = True) -> Schedule:
    return Schedule(name, m, tuple(range(len(rows))), tuple(tuple(r) for r in rows), training)


def naive(p: int, m: int) -> Schedule:
    """Stop-and-wait: each microbatch goes forward through every stage, then backward,
    before the next one starts (with m=1: the whole batch at once). One stage works at a
    time, so the bubble is (p-1)/p of the step whatever m is."""
    return _one_stage_per_rank("naive", m, [[a for i in range(m) for a in (F(r, i), B(r, i))] for r in range(p)])


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (all-forward-all-backward): all m forwards, then all m backwards."""
    return _one_stage_per_rank(
        "gpipe", m, [[F(r, i) for i in range(m)] + [B(r, i) for i in range(m)] for r in range(p)]
    )


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush): rank r runs min(p-r-1, m) warmup forwards, then alternates
    one forward and one backward, then drains the remaining backwards. At most
    min(p-r, m) microbatches are in flight on rank r."""
    rows = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [F(r, i) for i in range(warmup)]
        for k in range(m - warmup):
            row += [F(r, warmup + k), B(r, k)]
        row += [B(r, i) for i in range(m - warmup, m)]
        rows.append(row)
    return _one_stage_per_rank("1f1b", m, rows)


def forward_only(p: int, m: int) -> Schedule:
    """Inference/evaluation: microbatches flow forward through the stages, no backward."""
    return _one_stage_per_rank("forward_only", m, [[F(r, i) for i in range(m)] for r in range(p)], training=False)
