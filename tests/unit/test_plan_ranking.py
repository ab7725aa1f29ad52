"""The plan's ranking on cases checkable by hand: at equal costs GPipe and 1F1B take the same
step and 1F1B holds fewer microbatches, so 1F1B ranks first; a budget between them leaves
GPipe out; with a weight-gradient pass ZB-H1 fills 1F1B's bubble and ranks above it."""

from __future__ import annotations

import pytest

from ppx.cli import parser
from ppx.plan.evaluate import evaluate
from ppx.plan.inputs import PlanInputs
from ppx.plan.search import CLOSE_PCT, near_best, rank, search
from ppx.plan.space import Candidate, candidates
from ppx.schedules.registry import MAX_STAGE_MICROBATCHES

P, M, MIB = 4, 8, 2**20


def inputs(wgrad=0.0, budget=None, act=MIB, params=None) -> PlanInputs:
    return PlanInputs(
        fwd_s=(0.01,) * P,
        bwd_s=(0.01,) * P,
        wgrad_s=(wgrad,) * P,
        stages=P,
        act_bytes=(float(act),) * P,
        param_bytes=params,
        budget_bytes=budget,
    )


def plan(names, given: PlanInputs, vs=(2,)):
    cands, skipped = candidates(names, [P], [M], list(vs), given)
    results, refused = search(cands, given, jobs=1)
    return results, skipped + refused


def test_equal_costs_same_step_and_1f1b_first_for_its_memory():
    results, _ = plan(["gpipe", "1f1b"], inputs())
    by = {r.schedule: r for r in results}
    assert by["gpipe"].step_s == pytest.approx(by["1f1b"].step_s)
    assert by["gpipe"].step_s == pytest.approx((M + P - 1) * 0.02)  # fill, steady, drain: (m+p-1)(f+b)
    assert by["gpipe"].peak_max == M * MIB and by["1f1b"].peak_max == P * MIB  # m vs p microbatches held
    assert [r.schedule for r in results] == ["1f1b", "gpipe"]


def test_a_budget_between_them_leaves_gpipe_out():
    results, _ = plan(["gpipe", "1f1b"], inputs(budget=6 * MIB))
    assert [(r.schedule, r.fits) for r in results] == [("1f1b", True), ("gpipe", False)]


def test_params_count_against_the_budget_per_rank():
    # 1F1B's rank 0 holds 4 MiB of activations; 3 MiB of params per stage take it over 6 MiB
    results, _ = plan(["1f1b"], inputs(budget=6 * MIB, params=(3.0 * MIB,) * P))
    assert results[0].peak_bytes[0] == 7 * MIB and not results[0].fits


def test_zb_h1_ranks_above_1f1b_when_wgrad_is_not_zero():
    results, _ = plan(["1f1b", "zb_h1"], inputs(wgrad=0.01))
    by = {r.schedule: r for r in results}
    assert by["zb_h1"].step_s < by["1f1b"].step_s
    assert by["zb_h1"].peak_max == by["1f1b"].peak_max  # ZB-H1 keeps 1F1B's memory
    assert [r.schedule for r in results] == ["zb_h1", "1f1b"]


def test_virtual_families_at_each_v_and_fixed_v_at_their_own():
    results, skipped = plan(["interleaved_1f1b", "zbv", "1f1b"], inputs(), vs=(2, 3, 4))
    shapes = {(r.schedule, r.v) for r in results} | {(s.schedule, s.v) for s in skipped}
    assert shapes == {
        ("interleaved_1f1b", 2),
        ("interleaved_1f1b", 3),
        ("interleaved_1f1b", 4),
        ("zbv", 2),
        ("1f1b", 1),
    }


def test_refused_shapes_are_kept_with_their_reason():
    # interleaved 1F1B wants m a multiple of p: m = 6 at p = 4 is refused
    given = inputs()
    cands, skipped = candidates(["interleaved_1f1b"], [P], [6], [2], given)
    assert not cands and skipped[0].reason and skipped[0].m == 6


def test_a_list_larger_than_ppx_builds_is_skipped_not_planned():
    """ppx run refuses a list of more than MAX_STAGE_MICROBATCHES stage-microbatches: a plan
    skips such a shape with the run's reason (p x v x m), at v=1 as at v=2, zb_auto too."""
    m = (MAX_STAGE_MICROBATCHES // (2 * P * P) + 1) * P  # fits at v=1, not at v=2 (a multiple of p: interleaved)
    cands, skipped = candidates(["1f1b", "interleaved_1f1b", "zb_auto"], [P], [4, m], [2], inputs())
    assert sorted((c.schedule, c.m) for c in cands) == [
        ("1f1b", 4),
        ("1f1b", m),
        ("interleaved_1f1b", 4),
        ("zb_auto", 4),
        ("zb_auto", m),
    ]
    (big,) = [s for s in skipped if s.m == m]
    assert (big.schedule, big.v) == ("interleaved_1f1b", 2)
    assert big.reason.startswith(f"{P} ranks x 2 stages x {m} microbatches = {2 * P * m} stage-microbatches")
    over = MAX_STAGE_MICROBATCHES // P + 1
    cands, skipped = candidates(["1f1b", "zb_auto"], [P], [over], [1], inputs())
    assert not cands and {s.schedule for s in skipped} == {"1f1b", "zb_auto"}


def test_rank_puts_what_fits_first_then_by_throughput_then_memory():
    a, b, c = (evaluate(Candidate(n, P, M, 1), inputs(budget=6 * MIB)) for n in ("gpipe", "1f1b", "naive"))
    assert [r.schedule for r in rank([a, c, b])] == ["1f1b", "naive", "gpipe"]


def test_candidates_within_close_pct_of_the_best_are_named():
    """With t_w > 0 interleaved zero bubble leads and ZB-H1 and 1F1B trail it by more; near_best
    names exactly the fitting ones within the given share of the best's throughput."""
    results, _ = plan(["1f1b", "zb_h1", "interleaved_zb"], inputs(wgrad=0.01), vs=(2, 4))
    fitting = [r for r in results if r.fits]
    best = fitting[0].throughput
    for pct in (0.0, 1.0, 5.0, 20.0, 50.0):
        want = [r for r in fitting[1:] if best / r.throughput - 1 <= pct / 100 + 1e-12]
        assert near_best(results, pct) == want
    gaps = sorted(best / r.throughput - 1 for r in fitting[1:])
    assert near_best(results, 100 * (gaps[0] + gaps[1]) / 2) == [fitting[1]]  # between the two closest
    assert near_best(results, 100 * gaps[-1] + 1) == fitting[1:]


def test_nothing_is_near_when_nothing_fits():
    results, _ = plan(["gpipe", "1f1b"], inputs(budget=MIB // 2))
    assert not any(r.fits for r in results) and near_best(results, 50.0) == []


def test_the_commands_default_is_the_planners():
    assert parser().parse_args(["plan", "--fwd-ms", "1", "--bwd-ms", "1"]).close_pct == CLOSE_PCT


def test_a_run_directory_given_with_a_trailing_slash_is_named_without_it():
    """Shell completion ends a directory with "/": the notes and printed commands that name the
    run read "<run>'s costs" and "<run>/config.yaml", not "<run>/'s" and "<run>//config.yaml"."""
    from ppx.cli import parser

    assert parser().parse_args(["simulate", "zb_h1", "--from-run", "runs/x/"]).from_run == "runs/x"
    args = parser().parse_args(["plan", "--from-run", "runs/x//", "--machine-from", "calib/"])
    assert (args.from_run, args.machine_from) == ("runs/x", "calib")
    assert parser().parse_args(["plan", "--from-run", "/"]).from_run == "/"
