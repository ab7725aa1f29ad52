"""Interleaved 1F1B (Megatron-LM's virtual pipeline): each of p ranks holds v stages,
stage s on rank s % p, so a microbatch crosses every rank v times. Microbatches go through
the model chunks in groups of p; rank r warms up with 2(p-r-1) + (v-1)p forwards, then
alternates one forward and one backward, then drains. Bubble: (p-1)/(v m) of the ideal
time, for v times the point-to-point traffic."""

from __future__ import annotations

from ppx.errors import ScheduleError
from ppx.schedules.ir.action import B, F
from ppx.schedules.ir.schedule import Schedule


def _chunk_and_mb(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """The k-th forward (or backward) of a rank: (model chunk, microbatch)."""
    group, within = divmod(k, p * v)
    chunk = within // p
    if not forward:
        chunk = v - 1 - chunk
    return chunk, group * p + within % p


def shape_error(p: int, m: int, v: int) -> str | None:
    """Why interleaved 1F1B cannot take (p, m, v): microbatches go in groups of p."""
    if m % p:
        return f"interleaved_1f1b needs pipeline.microbatches ({m}) to be a multiple of pipeline.stages ({p})"
    return None


def interleaved_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    if v < 1:
        raise ScheduleError(f"interleaved_1f1b needs pipeline.virtual_stages >= 1, got {v}")
    why = shape_error(p, m, v)
    if why:
        raise ScheduleError(why)
    total = m * v
    rows, groups = [], []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        fwd = [_chunk_and_mb(k, p, v, True) for k in range(total)]
        bwd = [_chunk_and_mb(k, p, v, False) for k in range(total)]
        row = [F(c * p + r, i) for c, i in fwd[:warmup]]
        for k in range(total - warmup):
            c, i = fwd[warmup + k]
            row.append(F(c * p + r, i))
            c, i = bwd[k]
            row.append(B(c * p + r, i))
        row += [B(c * p + r, i) for c, i in bwd[total - warmup :]]
        rows.append(row)
        # steady-state forward+backward pairs communicate together, as in Megatron-LM:
        # the NCCL-strict dry run deadlocks without it
        groups.append(tuple([1] * warmup + [2] * (total - warmup) + [1] * warmup))
    stage_to_rank = tuple(s % p for s in range(p * v))
    return Schedule("interleaved_1f1b", m, stage_to_rank, tuple(tuple(r) for r in rows), groups=tuple(groups))
