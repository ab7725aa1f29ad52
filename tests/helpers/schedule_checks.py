"""What the schedule tests measure an order by: its own timing (zero communication, every
receive posted up front, every request independent) and its peak microbatches in flight."""

from __future__ import annotations

from ppx.schedules.comms.lowering import add_comms
from ppx.schedules.ir.action import Op
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.simulate import Timeline, simulate

UNIT = Costs(fwd=1, bwd=1, wgrad=1)  # t_f = t_b = t_w: the split-backward papers' figures


def own_timeline(sched, costs: Costs = UNIT) -> Timeline:
    """The order's own timing: zero communication, every receive posted up front (gloo)."""
    return simulate(add_comms(sched), costs, "gloo", -1)


def own_bubble(sched, costs: Costs = UNIT) -> float:
    return own_timeline(sched, costs).bubble_fraction()


def peak_in_flight(row) -> int:
    """Peak (stage, microbatch) pairs a rank holds: forwarded, backward (B, or I and W) not done."""
    live = peak = 0
    for a in row:
        live += (a.op is Op.F) - (a.op in (Op.B, Op.W))
        peak = max(peak, live)
    return peak
