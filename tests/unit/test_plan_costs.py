"""Both costs in a plan: every candidate carries its synchronous step (every rank starting
together) and its steady-state step (the longest rank's own span, never longer); --rank-by
steady ranks by the latter (zbv, whose later ranks start late, gains on it). The short forms
-p, -m, -v of ppx plan."""

from __future__ import annotations

from dataclasses import replace

from ppx.cli import parser
from ppx.commands.plan_inputs import from_flags
from ppx.plan.inputs import PlanInputs
from ppx.plan.search import search
from ppx.plan.space import candidates

P, M = 4, 8
INPUTS = PlanInputs(fwd_s=(0.01,) * P, bwd_s=(0.01,) * P, wgrad_s=(0.01, 0.01, 0.01, 0.015), stages=P)


def plan(given: PlanInputs):
    cands, _ = candidates(["1f1b", "zb_h1", "zbv", "interleaved_zb"], [P], [M], [3, 4], given)
    return search(cands, given, jobs=1)[0]


def test_both_steps_and_the_ranking_flag():
    sync = plan(INPUTS)
    steady = plan(replace(INPUTS, rank_by="steady"))
    assert all(r.steady_s <= r.step_s * (1 + 1e-12) for r in sync)
    assert any(r.steady_s < r.step_s * 0.99 for r in sync)  # the later ranks start later
    assert [r.ranked_s for r in sync] == sorted(r.step_s for r in sync)
    assert [r.ranked_s for r in steady] == sorted(r.steady_s for r in steady)
    assert [r.label() for r in sync] != [r.label() for r in steady]
    assert all(r.to_json()["steady_s"] == r.steady_s for r in steady)


def test_short_forms():
    args = parser().parse_args(["plan", "-p", "4", "-m", "8,16", "-v", "2", "--fwd-ms", "1", "--bwd-ms", "1"])
    assert (args.stages, args.microbatches, args.virtual, args.rank_by) == ("4", "8,16", "2", "sync")
    inputs, ps, ms = from_flags(args)
    assert (ps, ms, inputs.stages) == ([4], [8, 16], 4)
