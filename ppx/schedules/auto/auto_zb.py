"""The automatic zero-bubble schedule, ``zb_auto``: a compute order found for given per-stage
costs and a memory limit, one stage per rank (Qi et al., "Zero Bubble Pipeline Parallelism",
arXiv 2401.10241, section 3.1, automatic scheduling).

The paper's heuristic, on ppx's clock: each rank runs its warmup forwards, then input-gradient
passes I as soon as their gradients arrive (the critical path) and forwards while the memory
limit allows, filling the idle time with the weight passes W it holds
(`ppx.schedules.auto.greedy_fill`). Refinement: a small family of variants (how many microbatches
each rank keeps awaiting their I, the tie-break between a ready I and F, eager, recycling or
lazy W's, split or full backwards) ranked by that pass's own clock, and ZB-H1- and ZB-H2-shaped
orders with per-rank warmups and held-back W's (`ppx.schedules.auto.zb_family`) ranked by the same
clock for a fixed order (`ppx.schedules.auto.order_clock`); their best few and the handcrafted
orders that fit the limit (1F1B, ZB-H1, ZB-H2) go to the simulator (`simulate(place_comms(s,
"nccl"), costs)`) and the fastest is kept, so zb_auto is never slower than a built-in that
fits. Above SIMULATE_UP_TO microbatch-stages the simulator is too slow: the regular orders
alone (handcrafted and zb_family) are compared on the clock, since the pass's orders, whose
sends and receives do not alternate as regularly, lose up to a quarter under NCCL's in-order
batches there (the clock models gloo's independent requests).

Memory is counted as ppx's runtime holds it (`ppx.schedules.sim.memory.peak_held` with
input_share 0): F adds a microbatch's saved bytes, I frees nothing, W or B frees them all. A
stage whose W costs nothing runs one B instead (it frees the bytes at once).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ppx.errors import ScheduleError
from ppx.schedules.auto import zb_family
from ppx.schedules.auto.greedy_fill import Policy, StageTimes, actions, greedy_fill
from ppx.schedules.auto.order_clock import order_step
from ppx.schedules.families.basic import one_f_one_b
from ppx.schedules.families.zero_bubble import zb_h1, zb_h2
from ppx.schedules.ir.action import Action, F, I, Op, W
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.placing.placement import place_comms
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.memory import peak_held
from ppx.schedules.sim.simulate import simulate

NAME = "zb_auto"
PREFER = ("I", "alt", "F")  # tie-breaks between a ready I and a ready F
MEMBERS_AT_SCALE = 4  # zb_family members timed above SIMULATE_UP_TO (each a pass of the clock)
SIMULATED = 3  # variants the simulator ranks, the best by the pass's own clock
SIMULATE_UP_TO = 512  # p x m above which the pass's own clock alone decides (the simulator costs seconds)


def auto_zb(
    p: int,
    m: int,
    costs: Costs,
    act_bytes: Sequence[float] | None = None,
    mem_limit: float | Sequence[float] | None = None,
) -> Schedule:
    """The fastest order the heuristic finds for ``p`` ranks (stage s on rank s) and ``m``
    microbatches at ``costs``, holding at most ``mem_limit`` saved bytes on each rank (one value
    or one per rank; None: 1F1B's own peak on that rank, min(p - r, m) microbatches).
    ``act_bytes[s]``: bytes one microbatch's forward saves on stage s (None: 1 each, so the
    limit counts microbatches). Compute actions only (F, I, W, or B on a stage without W)."""
    if p < 1 or m < 1:
        raise ScheduleError(f"zb_auto needs at least one stage and one microbatch, got p={p}, m={m}")
    times = stage_times(p, costs)
    slots = memory_slots(p, m, act_bytes, mem_limit)
    members = [_whole(rows, times) for rows in zb_family.family(p, m, slots) if _fits(rows, slots)]
    built = [_whole(s.actions, times) for s in handcrafted(p, m, slots)]
    if p * m > SIMULATE_UP_TO:  # on the pass's clock; the regular orders only (see the module's doc)
        return _named(p, m, min(built + members[:MEMBERS_AT_SCALE], key=lambda rows: order_step(rows, m, times)))
    ranked = sorted(
        (greedy_fill(p, m, times, policy)[::-1] for policy in policies(p, m, times, slots)), key=lambda x: x[0]
    )
    best = []  # the distinct orders, best first by the pass's own step
    for _, rows in ranked:
        if all(rows != b for b in best):
            best.append(rows)
        if len(best) == SIMULATED:
            break
    members = sorted(members, key=lambda rows: order_step(rows, m, times))[:SIMULATED]
    candidates = built + members + [actions(rows) for rows in best]
    return _named(
        p, m, min(candidates, key=lambda rows: simulate(place_comms(_named(p, m, rows), "nccl"), costs).makespan)
    )


def _whole(rows, t: StageTimes) -> list[list[Action]]:
    """``rows`` with one B for each I and no W on the stages whose W costs nothing."""
    return [
        row if t.wgrad[r] > 0 else [a._replace(op=Op.B) if a.op is Op.I else a for a in row if a.op is not Op.W]
        for r, row in enumerate(rows)
    ]


def _fits(rows, slots: Sequence[int]) -> bool:
    """Whether no rank of ``rows`` ever holds more than ``slots`` microbatches (F adds one, W
    or B frees one)."""
    for row, n in zip(rows, slots):
        held = 0
        for a in row:
            held += 1 if a.op is Op.F else -1 if a.op in (Op.W, Op.B) else 0
            if held > n:
                return False
    return True


def _named(p: int, m: int, rows) -> Schedule:
    return Schedule(NAME, m, tuple(range(p)), tuple(tuple(row) for row in rows))


def handcrafted(p: int, m: int, slots: tuple[int, ...]) -> list[Schedule]:
    """The handcrafted one-stage-per-rank orders that fit ``slots`` microbatches per rank
    (1F1B, ZB-H1, ZB-H2): the refinement's floor, so zb_auto is never slower than they are."""
    out = []
    for s in (one_f_one_b(p, m), zb_h1(p, m), zb_h2(p, m)):
        if all(h <= n for h, n in zip(peak_held(s, [1.0] * p), slots)):
            out.append(s)
    return out


def stage_times(p: int, costs: Costs) -> StageTimes:
    """Per-stage F, I and W times of ``costs`` (their overhead and hand-off latency too)."""
    return StageTimes(
        tuple(costs.work(F(s, 0)) for s in range(p)),
        tuple(costs.work(I(s, 0)) for s in range(p)),
        tuple(costs.work(W(s, 0)) for s in range(p)),
        costs.after(F(0, 0)),
        costs.latency(),
    )


def memory_slots(
    p: int, m: int, act_bytes: Sequence[float] | None, mem_limit: float | Sequence[float] | None
) -> tuple[int, ...]:
    """Per rank, the most microbatches whose saved bytes fit ``mem_limit`` (at most m);
    ScheduleError when one microbatch does not fit or a size is malformed."""
    sizes = [1.0] * p if act_bytes is None else [float(b) for b in act_bytes]
    if len(sizes) != p or any(not b >= 0 for b in sizes):
        raise ScheduleError(f"zb_auto: act_bytes must be {p} sizes >= 0 (one per stage), got {list(sizes)}")
    if mem_limit is None:
        limits = [min(p - r, m) * sizes[r] for r in range(p)]
    elif isinstance(mem_limit, (int, float)):
        limits = [float(mem_limit)] * p
    else:
        limits = [float(x) for x in mem_limit]
    if len(limits) != p:
        raise ScheduleError(f"zb_auto: mem_limit must be one value or {p} (one per rank), got {len(limits)}")
    slots = []
    for r, (limit, size) in enumerate(zip(limits, sizes)):
        n = m if size == 0 else min(m, int(math.floor(limit / size * (1 + 1e-12))))
        if n < 1:
            raise ScheduleError(
                f"zb_auto: rank {r}'s memory limit {limit:g} is below one microbatch's saved activations "
                f"({size:g}): no schedule fits"
            )
        slots.append(n)
    return tuple(slots)


def round_trip(r: int, t: StageTimes) -> float:
    """From rank r's forward of a microbatch to its gradient's arrival, nothing queued."""
    hops = range(r + 1, len(t.fwd))
    return t.fwd[r] + sum(t.fwd[s] + t.bwd[s] for s in hops) + len(hops) * (2 * t.latency + 2 * t.overhead) + t.overhead


def policies(p: int, m: int, t: StageTimes, slots: tuple[int, ...]) -> list[Policy]:
    """The refinement family, the variants that win most often first: eager W's, eager W's
    that recycle memory first, then lazy W's x
    in-flight caps per rank (memory's; as many forwards as fit before the first I; 1F1B's;
    the round trip over the slowest stage's period plus 0..2) x the three tie-breaks, with
    split backwards where a stage has a W; then 1F1B's caps with full backwards everywhere."""
    split = tuple(w > 0 for w in t.wgrad)
    period = max(f + b + w + 3 * t.overhead for f, b, w in zip(t.fwd, t.bwd, t.wgrad)) or 1.0
    first = [max(t.fwd[r] + t.overhead, 1e-12) for r in range(p)]
    cap_sets = [
        slots,
        tuple(min(s, math.ceil(round_trip(r, t) / first[r])) for r, s in enumerate(slots)),
        tuple(min(s, p - r) for r, s in enumerate(slots)),
    ]
    for extra in (0, 1, 2):
        cap_sets.append(tuple(min(s, math.ceil(round_trip(r, t) / period) + extra) for r, s in enumerate(slots)))
    caps = list(dict.fromkeys(tuple(max(1, c) for c in cs) for cs in cap_sets))
    out = [
        Policy(c, slots, split, lazy, prefer, recycle)
        for lazy, recycle in ((False, False), (False, True), (True, False))
        for c in caps
        for prefer in PREFER
    ]
    return out + [Policy(cap_sets[2], slots, (False,) * p, False, prefer) for prefer in PREFER]
