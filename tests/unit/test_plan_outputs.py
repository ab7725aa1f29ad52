"""`ppx plan`'s files, through the command's entry point (one process, --jobs 1): plan.json
holds every candidate and every skipped shape, plan.md the table and the best, plan.png is a
PNG, and best.csv reads back as the best schedule with its stage-to-rank map."""

from __future__ import annotations

import json

import pytest

from ppx.cli import main
from ppx.plan.builders import AUTO
from ppx.schedules import registry
from ppx.schedules.csv_io import from_csv, read_csv

FLAGS = ["--fwd-ms", "10", "--bwd-ms", "10", "--wgrad-ms", "5", "--act-bytes", "64MiB", "--jobs", "1"]
SCHEDULES = f"gpipe,1f1b,zb_h1,interleaved_1f1b,zbv,dualpipev,{AUTO}"


def plan(tmp_path, *extra):
    out = tmp_path / "plan"
    code = main(["plan", *FLAGS, "--schedules", SCHEDULES, "--out", str(out), *extra])
    return code, out


def test_plan_json_holds_every_candidate_and_the_best(tmp_path, capsys):
    code, out = plan(tmp_path, "--microbatches", "6,8")
    assert code == 0
    data = json.loads((out / "plan.json").read_text())
    shapes = {(c["schedule"], c["m"], c["v"]) for c in data["candidates"]}
    skipped = {(s["schedule"], s["m"], s["v"]) for s in data["skipped"]}
    # every family at both m, interleaved at v = 2, 3, 4; dualpipev and interleaved refuse some m
    for name, vs in [("gpipe", [1]), ("1f1b", [1]), ("zb_h1", [1]), ("zbv", [2]), ("interleaved_1f1b", [2, 3, 4])]:
        for m in (6, 8):
            for v in vs:
                assert (name, m, v) in shapes | skipped
    assert all(s["reason"] for s in data["skipped"])
    assert len(data["candidates"]) + len(data["skipped"]) == 2 * (3 + 3 + 1 + 1 + 1)  # zb_auto: v = 1
    fields = {"schedule", "p", "m", "v", "step_s", "bubble", "peak_bytes", "peak_max_bytes", "fits"}
    assert all(fields <= set(c) for c in data["candidates"])
    assert data["best"] == data["candidates"][0]
    assert data["inputs"]["fwd_s"] == [0.01] * 4 and data["inputs"]["act_bytes"] == [64 * 2**20] * 4
    steps = [c["step_s"] * 1e3 for c in data["candidates"]]
    printed = capsys.readouterr().out
    assert f"{steps[0]:.2f}" in printed and "pipeline.schedule=" in printed


def test_plan_md_has_inputs_table_best_and_picture(tmp_path):
    code, out = plan(tmp_path, "--mem-budget", "300MiB")
    md = (out / "plan.md").read_text()
    best = json.loads((out / "plan.json").read_text())["best"]
    assert code == 0
    assert "memory budget per rank: 300.0 MiB" in md
    assert "| rank | schedule | p | m | v | step (ms)" in md
    assert f"**{best['schedule']} p=4 m=8 v={best['v']}**" in md
    assert "![step time against peak memory](plan.png)" in md
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "plan.png").stat().st_size > 10_000


@pytest.mark.parametrize("name, v", [("interleaved_1f1b", 2), ("zbv", 2), ("dualpipev", 2), ("zb_h1", 1)])
def test_best_csv_reads_back_as_the_schedule_with_its_stage_map(tmp_path, name, v):
    code, out = plan(tmp_path, "--schedules", name, "--virtual", str(v))
    assert code == 0
    want = registry.build(name, 4, 8, v)
    got = read_csv(out / "best.csv")
    assert got.stage_to_rank == want.stage_to_rank
    assert got.actions == want.compute_only().actions
    assert got.overlaps == want.overlaps  # dualpipev's forward-backward cells stay cells
    assert from_csv(out / "best.csv").num_stages == 4 * v  # what pipeline.schedule=best.csv resolves to


def test_an_existing_folder_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "keep").write_text("x")
    code, _ = plan(tmp_path)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("ppx: error: --out") and "\n" not in err
    assert (tmp_path / "plan" / "keep").read_text() == "x"


def test_nothing_fits_writes_the_plan_names_the_closest_and_exits_1(tmp_path, capsys):
    # below one microbatch's 64 MiB: even zb_auto, which holds as few as the budget allows, cannot
    code, out = plan(tmp_path, "--mem-budget", "50MiB")
    cap = capsys.readouterr()
    data = json.loads((out / "plan.json").read_text())
    closest = min(data["candidates"], key=lambda c: c["peak_max_bytes"])
    assert code == 1
    assert not (out / "best.csv").exists() and (out / "plan.md").exists() and (out / "plan.png").exists()
    assert data["best"] is None and not any(c["fits"] for c in data["candidates"])
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ppx: error: nothing fits --mem-budget 50MiB per rank")
    assert f"the closest is {closest['schedule']} p=4 m=8 v={closest['v']} at 256.0 MiB (206.0 MiB over)" in err[0]
    (auto,) = [s for s in data["skipped"] if s["schedule"] == AUTO]
    assert "below one microbatch" in auto["reason"], auto
    assert "| rank | schedule" not in cap.out and "rank  schedule" in cap.out  # the table was printed


def test_a_per_layer_plan_searches_p(tmp_path):
    code, out = plan(tmp_path, "--per-layer", "--fwd-ms", ",".join(["2"] * 8), "--stages", "2,4,8", "--virtual", "2")
    data = json.loads((out / "plan.json").read_text())
    assert code == 0
    assert {c["p"] for c in data["candidates"]} == {2, 4, 8}
    # 8 layers: p = 8 with v = 2 needs 16 stages, and is skipped for it
    assert any(s["p"] == 8 and s["v"] == 2 and "8 layers" in s["reason"] for s in data["skipped"])
    assert (out / "best.csv").exists()


def test_zb_auto_is_planned_once_per_p_and_m_within_the_budget(tmp_path):
    """The automatic schedule is one candidate per (p, m), one stage per rank, built for the
    plan's costs and budget: its predicted peak fits, and its best.csv (asked for alone) is a
    schedule ppx validates."""
    code, out = plan(tmp_path, "--schedules", f"1f1b,{AUTO}", "--microbatches", "4,8", "--mem-budget", "200MiB")
    data = json.loads((out / "plan.json").read_text())
    assert code == 0
    autos = [c for c in data["candidates"] if c["schedule"] == AUTO]
    assert sorted((c["m"], c["v"]) for c in autos) == [(4, 1), (8, 1)]
    assert all(c["fits"] and c["peak_max_bytes"] <= 200 * 2**20 for c in autos)
    code, out = plan(tmp_path / "alone", "--schedules", AUTO, "--microbatches", "8", "--mem-budget", "200MiB")
    sched = from_csv(out / "best.csv")
    assert code == 0 and sched.num_microbatches == 8 and sched.num_ranks == 4


def test_the_table_says_nothing_of_peaks_or_fitting_where_no_bytes_or_budget_were_given():
    """Flags alone give no bytes: the table's peak/rank and fits say "-", not "0 B" and "yes";
    with bytes, the peak; with a budget, whether it fits."""
    from dataclasses import replace

    from ppx.plan.inputs import PlanInputs
    from ppx.plan.search import search
    from ppx.plan.space import candidates
    from ppx.plan.table import rows

    bare = PlanInputs(fwd_s=(0.01, 0.01), bwd_s=(0.02, 0.02), wgrad_s=(0.0, 0.0), stages=2)

    def table(inputs: PlanInputs) -> list[list[str]]:
        cands, _ = candidates(["1f1b", "gpipe", "zb_h1"], [2], [4], [1], inputs)
        return rows(search(cands, inputs, jobs=1)[0], None)

    assert {tuple(r[-2:]) for r in table(bare)} == {("-", "-")}
    sized = replace(bare, act_bytes=(2.0**20, 2.0**20))
    assert all(r[-2].endswith("MiB") and r[-1] == "-" for r in table(sized)), table(sized)
    assert {r[-1] for r in table(replace(sized, budget_bytes=3 * 2.0**20))} == {"yes", "no"}


def test_a_plan_without_bytes_says_so_in_plan_md_not_a_peak_of_0_b(tmp_path, capsys):
    """Flags without --act-bytes or --param-bytes: plan.md's best gives no peak, where it gave
    "peak 0 B per rank"; with bytes, the peak."""
    bare = tmp_path / "bare"
    assert main(["plan", "--fwd-ms", "10", "--bwd-ms", "10", "--schedules", "1f1b,gpipe", "--out", str(bare)]) == 0
    best = next(line for line in (bare / "plan.md").read_text().splitlines() if line.startswith("**"))
    assert best.endswith("(no bytes given: no peak).") and "0 B" not in best, best
    code, out = plan(tmp_path)
    assert code == 0 and " per rank." in next(
        x for x in (out / "plan.md").read_text().splitlines() if x.startswith("**")
    )
