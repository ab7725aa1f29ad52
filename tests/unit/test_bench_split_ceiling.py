"""bench/split_backward.py's ceiling: what a zero-bubble schedule can gain over 1F1B with given costs."""

import pytest

from bench.split_backward import ceiling


def _variants(p: int, w: float) -> dict:
    costs = {}
    for s in range(2 * p):  # ZB-V's 2p stages; ZB-H1 reads the first p
        costs.update({f"{s}F": 1.0, f"{s}I": 1.0, f"{s}W": w})
    return {"zb_h1": {"action_s": costs}, "zbv": {"action_s": costs}}


@pytest.mark.parametrize("p", [2, 4])
def test_zb_h1_ceiling_is_the_closed_form_with_equal_costs(p):
    # F = I = W: 1F1B takes (m + p - 1) * 3, ZB-H1 m * 3 + (p - 1) * (F + I - W)
    m = 8
    assert ceiling(_variants(p, 1.0), "zb_h1", p, m) == pytest.approx((3 * m + p - 1) / (3 * (m + p - 1)))


@pytest.mark.parametrize("p", [2, 4])
def test_no_weight_pass_leaves_zb_h1_nothing_to_gain(p):
    assert ceiling(_variants(p, 0.0), "zb_h1", p, 8) == pytest.approx(1.0)


def test_zbv_sums_a_ranks_two_stages_for_1f1b():
    # each ZB-V rank holds two half stages; with W = I its ceiling beats ZB-H1's
    v = _variants(4, 1.0)
    assert ceiling(v, "zbv", 4, 8) < ceiling(v, "zb_h1", 4, 8) < 1.0


def test_a_rerun_of_no_configuration_is_refused_in_one_line_before_any_run():
    from bench.reruns import rerun_split

    with pytest.raises(SystemExit, match=r"--split 'fp64': no configuration's name holds it: llama-tiny"):
        rerun_split("fp64")


def test_check_all_takes_the_configurations_whose_name_holds_the_text(monkeypatch):
    import bench.split_backward as sb

    ran = []
    monkeypatch.setattr(sb, "check_config", lambda model, dtype, p: ran.append((model, dtype, p)) or {})
    assert sorted(sb.check_all("fp32 p=2")) == sorted(f"{m} fp32 p=2" for m in sb.MODELS)
    assert ran == [(m, "fp32", 2) for m in sb.MODELS]


def _paired(alone_zb: float, timed_zb: float) -> dict:
    ms = {f"{k}@{n}": 0.1 for k in ("ppx", "ppx_all") for n in ("1f1b", "zb_h1", "zbv")}
    ratio = {"ppx@zb_h1": alone_zb, "ppx@zbv": 1.1, "ppx_all@zb_h1": timed_zb, "ppx_all@zbv": 1.1}
    return {"m fp32 p=2": {"median_step_s": ms, "pairs": 60, "ratio": ratio}}


@pytest.mark.parametrize("alone, timed, verdict", [(0.98, 0.99, "pass"), (0.98, 1.01, "MISS"), (1.02, 0.97, "MISS")])
def test_paired_rows_pass_only_where_zb_h1_is_faster_alone_and_with_instruments(alone, timed, verdict):
    from bench.split_paired import paired_rows

    (row,) = paired_rows(_paired(alone, timed), "x86_64, 2 cores")
    assert row[3] == verdict and f"ZB-H1 {alone:.3f}x" in row[1] and f"ZB-H1 {timed:.3f}x" in row[1]
    assert "median of 60 pairs in one job" in row[0]


def test_a_paired_row_of_one_job_per_list_says_so_and_gives_drain():
    from bench.split_paired import DRAIN, paired_rows

    got = _paired(0.98, 0.99)["m fp32 p=2"]
    got["ratio"].update({f"ppx@{DRAIN}": 0.975, f"ppx_all@{DRAIN}": 0.985})
    (row,) = paired_rows({"m fp32 p=2": {**got, "jobs": "one per variant"}}, "x86_64, 2 cores")
    assert "median of 60 pairs in one job per variant, against 1F1B" in row[0]
    assert "ZB-V 1.100x, ZB-H1 drain 0.975x (1F1B" in row[1] and "ZB-H1 drain 0.985x" in row[1]
    from bench.split_paired import H2_DRAIN

    got["ratio"].update({f"ppx@{H2_DRAIN}": 0.94, f"ppx_all@{H2_DRAIN}": 0.95})
    (row,) = paired_rows({"m fp32 p=2": {**got, "jobs": "one per variant"}}, "x86_64, 2 cores")
    assert "ZB-H1 drain 0.975x, ZB-H2 drain 0.940x (1F1B" in row[1] and "ZB-H2 drain 0.950x" in row[1]


def test_a_paired_row_measured_on_another_machine_says_where_and_when():
    from bench.split_paired import _where, paired_rows

    here = _where()
    got = _paired(0.98, 0.99)["m fp32 p=2"]
    elsewhere = {**got, "machine": "x86_64, 16 cores, torch 2.11, the job on 8 of its CPUs", "date": "2026-11-28"}
    (row,) = paired_rows({"m fp32 p=4": elsewhere}, here)
    assert "(measured 2026-11-28 on x86_64, 16 cores, torch 2.11, the job on 8 of its CPUs)" in row[0]
    (row,) = paired_rows({"m fp32 p=2": {**got, "machine": here, "date": "2026-11-28"}}, here)
    assert "measured 2026" not in row[0]  # the header's machine: said once, above the table


def test_a_rerun_of_an_unknown_case_is_refused_in_one_line():
    from bench.reruns import rerun_cases

    with pytest.raises(SystemExit, match=r"--cases: no case nope; cases: mlp_gpipe_p4"):
        rerun_cases(["nope"], 1.0)


def test_paired_configurations_with_more_ranks_than_cores_are_not_measured(monkeypatch):
    import bench.split_paired as sb

    ran = []
    monkeypatch.setattr(sb, "check_paired", lambda model, dtype, p: ran.append((model, dtype, p)) or _paired(1, 1))
    got = sb.check_paired_all("fp32", cores=2)
    assert ran == [(m, "fp32", 2) for m in sb.MODELS] + [(sb.AS_FILED, "fp32", 2)]
    assert sorted(got) == sorted([f"{m} fp32 p={p}" for m in sb.MODELS for p in (2, 4)] + [f"{sb.AS_FILED} fp32 p=2"])
    skipped = [got[f"{m} fp32 p=4"] for m in sb.MODELS]
    assert all(s == {"skipped": "needs a core per rank (4); this machine has 2"} for s in skipped)
    rows = sb.paired_rows({"x p=4": skipped[0]}, "x86_64, 2 cores")
    assert rows[0][1:] == ("not measured: needs a core per rank (4); this machine has 2", "ZB-H1 < 1F1B", "skipped")


def test_the_issues_own_table_is_a_paired_configuration_at_the_shipped_shape():
    """The shipped llama-tiny experiment as it is (m=4: the shape the split-backward issue's table
    was measured at), beside the 8-block models at m=8; its row says its m."""
    from bench.split_paired import AS_FILED, PAIRED_CONFIGS, _shape, paired_rows
    from ppx import config

    assert PAIRED_CONFIGS[f"{AS_FILED} fp32 p=2"] == (AS_FILED, "fp32", 2)
    cfg = config.load(*_shape(AS_FILED))
    assert (cfg.pipeline.microbatches, cfg.model.preset) == (4, "llama-tiny")
    assert config.load(*_shape("llama-tiny (8 blocks)")).pipeline.microbatches == 8
    got = _paired(0.98, 0.99)["m fp32 p=2"]
    (row,) = paired_rows({f"{AS_FILED} fp32 p=2": {**got, "m": 4}}, "x86_64, 2 cores")
    assert row[0].startswith(f"split backward, steps side by side, {AS_FILED} fp32 p=2, m=4: ")


@pytest.mark.parametrize(
    "cores, verdicts", [(4, ["MISS", "pass"]), (2, ["not judged", "not judged"]), (None, ["MISS", "pass"])]
)
def test_whole_run_rows_judge_no_times_where_ranks_shared_cores(cores, verdicts):
    """p=4 on a 2-core machine: (I + W) / B and the steps are said, not judged (a rank's action
    takes its share of a core there); the saved bytes stand either way."""
    from bench.split_backward import split_rows

    v = {
        n: {
            "action_s": _variants(4, 0.5)["zb_h1"]["action_s"],
            "step_s": step,
            "runs_s": [step],
            "peak_saved_bytes": [1024] * 4,
            "predicted_s": step,
        }
        for n, step in (("1f1b", 0.10), ("zb_h1", 0.09), ("zbv", 0.095), ("zb_h1_graph", 0.12))
    }
    got = {"variants": v, "iw_over_b": [1.2, 1.0, 1.0, 1.0], "iw_over_b_graph": [1.5] * 4}
    if cores is not None:
        got["cores"] = cores
    iw, steps, saved = split_rows({"m fp32 p=4": got})
    assert [iw[3], steps[3]] == verdicts
    assert ("(4 ranks on 2 cores: times shared, not judged)" in iw[1] + steps[1]) == (cores == 2)
    assert saved[1] == "1, 1, 1, 1 against 1, 1, 1, 1"


def test_zbv_split_by_units_is_a_paired_variant_of_the_llama_models():
    """The V puts llama's embedding and head stages on one rank: split by FLOPs (the default)
    its blocks are even over the 2p stages, the embedding and head riding on the ends; a variant
    runs ZB-V split by units, as before, where that differs; none for the transformer, whose
    units are its blocks; its ratio shows in the row, and so does an older row's blocks-even
    variant."""
    from bench.split_paired import AS_FILED, _said, _shape, units_variant
    from ppx import config

    def variant(model: str, p: int) -> str | None:
        exp, keys = _shape(model)
        return units_variant(config.load(exp, [*keys, f"pipeline.stages={p}"]), p)

    assert variant("llama-tiny (8 blocks)", 2) == "zbv+pipeline.balance=units"
    assert variant("llama-tiny (8 blocks)", 4) == "zbv+pipeline.balance=units"
    assert variant(AS_FILED, 2) == "zbv+pipeline.balance=units" and variant(AS_FILED, 4) is None
    assert variant("transformer (hidden 64, 8 blocks)", 2) is None
    got = _paired(0.98, 0.99)["m fp32 p=2"]
    got["ratio"]["ppx@zbv+pipeline.balance=units"] = 1.152
    assert "ZB-V 1.100x, ZB-V split by units 1.152x (1F1B" in _said(got, "ppx")
    got["ratio"]["ppx@zbv+pipeline.layers_per_stage=[3,2,2,3]"] = 1.004
    assert "ZB-V blocks even [3,2,2,3] 1.004x" in _said(got, "ppx")
