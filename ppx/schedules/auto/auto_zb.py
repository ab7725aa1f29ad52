"""The automatic zero-bubble schedule, ``zb_auto``: a compute order found for given per-stage
costs, a memory accounting and limit, one stage per rank (Qi et al., "Zero Bubble Pipeline
Parallelism", arXiv 2401.10241, section 3.1, automatic scheduling).

Memory is counted as `ppx.schedules.auto.accounting.Memory` counts it: F adds a microbatch's
saved bytes, I frees ``input_share`` of them (ppx's runtime: 0, or the share a split backward
that stores frees; the paper: (M_B - M_W) / M_B), W the rest, B all. A stage whose W costs
nothing runs one B instead.

The candidates: the handcrafted orders that fit (1F1B, ZB-H1, ZB-H2: zb_auto is never slower
than they are); ZB-H1- and ZB-H2-shaped orders with per-rank warmups that fill each rank's
wait for its first gradient and W's held back on the later ranks (`ppx.schedules.auto.zb_family`);
the paper's list-scheduling heuristic (`ppx.schedules.auto.greedy_fill`: I as soon as its
gradient arrives, forwards while the memory allows, W's filling the idle time) seeded with
the best ZB-shaped orders' warmups and held-back W's (`seeded_pass`), and below GREEDY_UP_TO
microbatch-stages a family of its variants. Each is built at the limit
given and at every limit below it on a ladder (`ladder`): k microbatches on every rank, so that
more memory never gives a slower order (the best over all of them). They are ranked by
``cost``: ``sync`` (every rank starting together: what `ppx run` measures) or ``steady`` (the
longest rank's own span: what consecutive steps cost with no rank waiting at a step boundary,
the paper's cost), on the clock of a fixed order (`ppx.schedules.auto.order_clock`) and, below
SIMULATE_UP_TO, on the simulator (`simulate(place_comms(s, "nccl"), costs)`) for all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ppx.errors import ScheduleError
from ppx.schedules.auto import zb_family
from ppx.schedules.auto.accounting import Memory, memory
from ppx.schedules.auto.greedy_fill import Policy, StageTimes, actions, greedy_fill
from ppx.schedules.auto.order_clock import COSTS, order_cost
from ppx.schedules.auto.refine import refine
from ppx.schedules.families.basic import one_f_one_b
from ppx.schedules.families.zero_bubble import zb_h1, zb_h2
from ppx.schedules.ir.action import Action, F, I, Op, W
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.placing.placement import place_comms
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.simulate import Timeline, simulate

NAME = "zb_auto"
PREFER = ("I", "alt", "F")  # tie-breaks between a ready I and a ready F
SIMULATED = 12  # the orders fastest on the clock that the simulator ranks (with the handcrafted ones)
SIMULATE_UP_TO = 512  # p x m above which the clock alone decides (the simulator costs seconds)
GREEDY_UP_TO = 128  # p x m above which the list-scheduling pass is left out (its variants cost seconds)
REFINED, REFINE_TRIES = 2, 12  # family members refined per limit, and orders each may time
WHOLE_LADDER_UP_TO = 128  # p x m up to which the ladder is every whole microbatch; above, multiples of p


def auto_zb(
    p: int,
    m: int,
    costs: Costs,
    act_bytes: Sequence[float] | None = None,
    mem_limit: float | Sequence[float] | None = None,
    input_share: float | Sequence[float] = 0.0,
    cost: str = "sync",
    judge: str = "simulator",
) -> Schedule:
    """The fastest order found for ``p`` ranks (stage s on rank s) and ``m`` microbatches at
    ``costs``, holding at most ``mem_limit`` saved bytes on each rank (one value or one per
    rank; None: 1F1B's own peak on that rank, min(p - r, m) microbatches). ``act_bytes[s]``:
    bytes one microbatch's forward saves on stage s (None: 1 each, so the limit counts
    microbatches); ``input_share``: the share of them an I frees; ``cost``: ``sync`` or
    ``steady`` (the module's doc); ``judge``: ``simulator`` (up to SIMULATE_UP_TO, ppx's own
    placement under NCCL) or ``clock`` (the fixed order's clock alone: the paper's model, a
    hand-off a fixed delay). Compute actions only (F, I, W, or B on a stage without W)."""
    if p < 1 or m < 1:
        raise ScheduleError(f"zb_auto needs at least one stage and one microbatch, got p={p}, m={m}")
    if cost not in COSTS:
        raise ScheduleError(f"zb_auto: cost must be one of {', '.join(COSTS)}, got {cost!r}")
    if judge not in ("simulator", "clock"):
        raise ScheduleError(f"zb_auto: judge must be simulator or clock, got {judge!r}")
    mem = memory(p, m, act_bytes, mem_limit, input_share)
    clock = Clock(m, stage_times(p, costs), cost)
    rows = candidates(p, m, clock, mem)
    if judge == "clock" or p * m > SIMULATE_UP_TO:
        return _named(p, m, min(rows, key=clock))
    built = [_whole(list(s.actions), clock.t) for s in handcrafted(p, m)]
    shortlist = [x for x in built if mem.holds(x)] + sorted(rows, key=clock)[:SIMULATED]
    return _named(
        p, m, min(shortlist, key=lambda x: timeline_cost(simulate(place_comms(_named(p, m, x), "nccl"), costs), cost))
    )


class Clock:
    """An order's cost on the fixed order's clock, each distinct order timed once."""

    def __init__(self, m: int, t: StageTimes, cost: str):
        self.m, self.t, self.cost, self._seen = m, t, cost, {}

    def __call__(self, rows) -> float:
        key = tuple(map(tuple, rows))
        if key not in self._seen:
            self._seen[key] = order_cost(rows, self.m, self.t, self.cost)
        return self._seen[key]


def timeline_cost(t: Timeline, cost: str) -> float:
    """A simulated step's ``sync`` cost (its makespan) or ``steady`` cost (the longest rank's
    span from its first compute's start to its end)."""
    return t.makespan if cost == "sync" else t.steady()


def candidates(p: int, m: int, clock: Clock, mem: Memory) -> list[list[list[Action]]]:
    """Every distinct order tried, each within ``mem`` (`auto_zb`'s doc): the handcrafted
    orders; at each point of the ladder, the ZB-shaped family and its best REFINED refined
    (`ppx.schedules.auto.refine`, on ``clock``), and on small shapes the pass."""
    out: dict = {}
    t = clock.t
    found = [_whole(list(s.actions), t) for s in handcrafted(p, m)]
    free: set = set()  # policies whose pass no limit held back
    for point in ladder(p, m, mem):
        members = zb_family.family(p, m, trips(p, t), point, p * m <= GREEDY_UP_TO)
        found += [_whole(rows, t) for _, rows in members]
        ranked = sorted(members, key=lambda x: clock(x[1]))[:REFINED]
        refined = [refine(p, m, shape, t, point, clock.cost, REFINE_TRIES) for shape, _ in ranked]
        found += [_whole(rows, t) for rows, _, _ in refined]
        for shape in dict.fromkeys([s for s, _ in ranked] + [s for _, _, s in refined]):
            found += seeded_pass(p, m, t, shape, point)
        if p * m <= GREEDY_UP_TO:
            for policy in policies(p, m, t, point):
                if policy not in free:  # the same order as at a lower limit that never held it back
                    rows, _, bound = greedy_fill(p, m, t, policy, point)
                    found.append(actions(rows))
                    if not bound:
                        free.add(policy)
    for rows in found:
        key = tuple(map(tuple, rows))
        if key not in out and mem.holds(rows):
            out[key] = [list(r) for r in rows]
    return list(out.values())


def seeded_pass(p: int, m: int, t: StageTimes, shape: zb_family.Shape, mem: Memory) -> list:
    """The list-scheduling pass run with a ZB-shaped order's own warmups as its in-flight caps
    and its held-back W's as its reserve: the same steady state, but each rank takes an I as
    soon as its gradient arrives and fills the waits with W's, which the fixed shape cannot do
    where the ranks' warmups end at different microbatches (the drain). One pass, cheap at any
    size (p=32, m=256: 0.06 s). [] where the pass cannot finish."""
    warmup, deferred, w_first = shape
    caps = tuple(max(1, w + (0 if w_first else 1)) for w in warmup)
    policy = Policy(caps, tuple(w > 0 for w in t.wgrad), reserve=tuple(deferred))
    try:
        rows, _, _ = greedy_fill(p, m, t, policy, mem)
    except ScheduleError:
        return []
    return [actions(rows)]


def ladder(p: int, m: int, mem: Memory) -> list[Memory]:
    """The limits searched: ``mem``'s own, and below it k microbatches on every rank (every
    whole k up to WHOLE_LADDER_UP_TO microbatch-stages, else multiples of p), those within
    ``mem``'s limit on every rank."""
    top = max((x / a if a > 0 else m for x, a in zip(mem.limit, mem.act)), default=1.0)
    top = min(top, float(m))  # beyond m microbatches on every rank no limit binds
    ks = range(1, int(math.floor(top + 1e-9)) + 1)
    if p * m > WHOLE_LADDER_UP_TO:
        ks = [k for k in ks if k % p == 0]
    points = [mem.scaled(k) for k in ks]
    return [x for x in points if all(a <= b * (1 + 1e-9) for a, b in zip(x.limit, mem.limit))] + [mem]


def _whole(rows, t: StageTimes) -> list[list[Action]]:
    """``rows`` with one B for each I and no W on the stages whose W costs nothing."""
    return [
        row if t.wgrad[r] > 0 else [a._replace(op=Op.B) if a.op is Op.I else a for a in row if a.op is not Op.W]
        for r, row in enumerate(rows)
    ]


def _named(p: int, m: int, rows) -> Schedule:
    return Schedule(NAME, m, tuple(range(p)), tuple(tuple(row) for row in rows))


def handcrafted(p: int, m: int) -> list[Schedule]:
    """The handcrafted one-stage-per-rank orders (1F1B, ZB-H1, ZB-H2): the floor of those that
    fit, so zb_auto is never slower than they are."""
    return [one_f_one_b(p, m), zb_h1(p, m), zb_h2(p, m)]


def stage_times(p: int, costs: Costs) -> StageTimes:
    """Per-stage F, I and W times of ``costs`` (their overhead and hand-off latency too)."""
    return StageTimes(
        tuple(costs.work(F(s, 0)) for s in range(p)),
        tuple(costs.work(I(s, 0)) for s in range(p)),
        tuple(costs.work(W(s, 0)) for s in range(p)),
        costs.after(F(0, 0)),
        costs.latency(),
    )


def round_trip(r: int, t: StageTimes) -> float:
    """From rank r's forward of a microbatch to its gradient's arrival, nothing queued."""
    hops = range(r + 1, len(t.fwd))
    return t.fwd[r] + sum(t.fwd[s] + t.bwd[s] for s in hops) + len(hops) * (2 * t.latency + 2 * t.overhead) + t.overhead


def trips(p: int, t: StageTimes) -> list[float]:
    """Per rank, its wait from its first forward's start to its first gradient, in its forwards."""
    return [round_trip(r, t) / max(t.fwd[r] + t.overhead, 1e-12) for r in range(p)]


def policies(p: int, m: int, t: StageTimes, mem: Memory) -> list[Policy]:
    """The refinement family, the variants that win most often first: eager W's, eager W's
    that recycle memory first, then lazy W's x
    in-flight caps per rank (memory's; as many forwards as fit before the first I; 1F1B's;
    the round trip over the slowest stage's period plus 0..2) x the three tie-breaks, with
    split backwards where a stage has a W; then 1F1B's caps with full backwards everywhere."""
    split = tuple(w > 0 for w in t.wgrad)
    slots = tuple(zb_family._whole(mem.limit[r], mem.act[r], m) for r in range(p))
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
        Policy(c, split, lazy, prefer, recycle)
        for lazy, recycle in ((False, False), (False, True), (True, False))
        for c in caps
        for prefer in PREFER
    ]
    return out + [Policy(cap_sets[2], (False,) * p, False, prefer) for prefer in PREFER]
