"""The memory accounting the automatic zero-bubble schedule searches under: per stage the bytes
one microbatch's F saves and the share of them its I frees (W frees the rest, B all of them),
per rank the most bytes it may hold. ppx's runtime frees nothing at I unless a split backward
stores (summary.json's ``input_freed_share``; a negative share, an I that re-runs a recomputed
forward and so adds, is placed here as 0 by `ppx.plan.builders`); the zero-bubble paper counts M_B = 34h + 5as
per F and M_W = 32h freed by W, so its I frees (M_B - M_W) / M_B."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from ppx.errors import ScheduleError
from ppx.schedules.ir.action import Action, Op
from ppx.units import format_bytes


@dataclass(frozen=True)
class Memory:
    """Per stage, the bytes one microbatch's F saves (``act``) and the share of them its I
    frees (``share``); per rank, the most bytes it may hold (``limit``). Rank r runs stage r."""

    act: tuple[float, ...]
    share: tuple[float, ...]
    limit: tuple[float, ...]

    def fits(self, r: int, held: float) -> bool:
        """Whether ``held`` bytes fit rank r's limit (up to rounding)."""
        return held <= self.limit[r] * (1 + 1e-9) + 1e-12

    def change(self, r: int, op: Op) -> float:
        """What ``op`` on rank r adds to its held bytes (negative: frees)."""
        a = self.act[r]
        if op is Op.F:
            return a
        if op is Op.I:
            return -self.share[r] * a
        if op is Op.W:
            return -(1 - self.share[r]) * a
        return -a if op is Op.B else 0.0

    def peaks(self, rows: Sequence[Sequence[Action]]) -> list[float]:
        """Each rank's peak held bytes walking ``rows`` (rank r's actions, on stage r)."""
        out = []
        for r, row in enumerate(rows):
            delta = {op: self.change(r, op) for op in (Op.F, Op.I, Op.W, Op.B)}
            out.append(max(accumulate(delta[a[1]] for a in row), default=0.0) if row else 0.0)
        return [max(0.0, x) for x in out]

    def holds(self, rows: Sequence[Sequence[Action]]) -> bool:
        """Whether no rank of ``rows`` ever holds more than its limit."""
        return all(self.fits(r, x) for r, x in enumerate(self.peaks(rows)))

    def scaled(self, k: float) -> Memory:
        """The same accounting with every rank's limit k microbatches of its stage's bytes."""
        return Memory(self.act, self.share, tuple(k * a for a in self.act))


def memory(
    p: int,
    m: int,
    act_bytes: Sequence[float] | None,
    mem_limit: float | Sequence[float] | None,
    input_share: float | Sequence[float] = 0.0,
) -> Memory:
    """The accounting of ``auto_zb``'s arguments: ``act_bytes`` per stage (None: 1 each, so the
    limit counts microbatches), ``mem_limit`` one value or one per rank (None: 1F1B's peak on
    each rank, min(p - r, m) microbatches), ``input_share`` one value or one per stage.
    ScheduleError for a malformed size or a rank whose limit is below one microbatch."""
    act = [1.0] * p if act_bytes is None else [float(b) for b in act_bytes]
    if len(act) != p or any(not b >= 0 for b in act):
        raise ScheduleError(f"zb_auto: act_bytes must be {p} sizes >= 0 (one per stage), got {list(act)}")
    share = [float(input_share)] * p if isinstance(input_share, (int, float)) else [float(s) for s in input_share]
    if len(share) != p or any(not 0 <= s <= 1 for s in share):
        raise ScheduleError(f"zb_auto: input_share must be one value or {p}, each in [0, 1], got {share}")
    if mem_limit is None:
        limits = [min(p - r, m) * act[r] for r in range(p)]
    elif isinstance(mem_limit, (int, float)):
        limits = [float(mem_limit)] * p
    else:
        limits = [float(x) for x in mem_limit]
    if len(limits) != p:
        raise ScheduleError(f"zb_auto: mem_limit must be one value or {p} (one per rank), got {len(limits)}")
    # the limits count bytes where act_bytes are given, else microbatches of a stage
    amount = (lambda x: f"{x:g} microbatch" + ("" if x == 1 else "es")) if act_bytes is None else format_bytes
    for r, (limit, one) in enumerate(zip(limits, act)):
        if not math.isfinite(limit) and limit > 0:
            continue
        if one > 0 and limit < one * (1 - 1e-12):
            raise ScheduleError(
                f"zb_auto: rank {r}'s memory limit {amount(limit)} is below one microbatch's saved activations "
                f"({amount(one)}): no schedule fits"
            )
    return Memory(tuple(act), tuple(share), tuple(limits))
