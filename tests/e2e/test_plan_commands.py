"""Every `ppx run` command `ppx plan` prints runs as printed: per model kind, a short 1F1B
calibration run, a plan from it (v = 2 and 3) whose every candidate's command (plan.json)
passes `ppx run`'s config checks and whose best's printed command runs to completion; the
known-cost model with per-stage cost lists, split by a ZB-H1 run, at v = 3 (p·v = 6 cost
lists); a plan from flags, its printed command run as printed. A run that never split its
backward gets its split-backward candidates refused, with the run that measures them."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from helpers import measured_peaks, ppx, read_json
from ppx.commands.run_costs import run_costs
from ppx.plan.howto import check
from ppx.plan.space import SPLIT_REASON
from ppx.report.run_dir import RunDir

SHORT = ["train.steps=3", "train.batch_size=8"]
KINDS = {
    "mlp": ["1f1b_2cpu", "model.hidden=16"],
    "transformer": ["transformer_1f1b_2cpu", "model.hidden=32", "model.seq_len=16"],
    "llama": ["llama_tiny_1f1b_2cpu"],
    "synthetic": ["1f1b_2cpu", "model.kind=synthetic", "model.fwd_ms=[4,6]", "model.bwd_ms=4", "model.wgrad_ms=[2,3]"],
}


def printed(stdout: str) -> list[str]:
    return next(line for line in stdout.splitlines() if line.startswith("ppx run ")).split()


def plan_and_run(tmp_path, calibration: list[str], *plan_args: str):
    run = ppx("run", *calibration, *SHORT, f"run.dir={tmp_path / 'calib'}")
    assert run.returncode == 0, run.stderr[-3000:]
    r = ppx("plan", "--from-run", str(tmp_path / "calib"), *plan_args, "--out", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    for c in plan["candidates"]:
        assert check(c["command"]) is None, c["command"]
    words = printed(r.stdout)
    again = ppx("run", *words[2:], "train.steps=2", f"run.dir={tmp_path / 'best'}")
    assert again.returncode == 0, again.stderr[-3000:]
    s = read_json(tmp_path / "best" / "summary.json")
    assert s["status"] == "completed" and s["microbatches"] == plan["best"]["m"]
    return r, plan, s


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_command_of_a_plan_from_a_1f1b_run_runs(tmp_path, kind):
    r, plan, s = plan_and_run(tmp_path, KINDS[kind], "-v", "2,3", "-m", "4,8")
    refused = {x["schedule"] for x in plan["skipped"] if x["reason"].startswith(SPLIT_REASON)}
    assert {"zb_h1", "zbv", "zb_auto"} <= refused and "pipeline.schedule=zb_h1" in r.stdout
    assert not any(c["schedule"] in refused for c in plan["candidates"])
    if kind != "synthetic":  # (its units sleep: no bytes to weigh) the best's stages regroup the run's units
        assert plan["best"]["peak_bytes"] == pytest.approx(measured_peaks(tmp_path / "best"), rel=0.05), plan["best"]
    if kind in ("mlp", "transformer"):  # 4 blocks: 3 stages per rank (6) cannot each hold one
        assert any("cannot run" in x["reason"] for x in plan["skipped"])


def test_a_plan_from_a_1f1b_llama_run_regroups_its_units_and_names_its_calibration(tmp_path):
    """llama-tiny's 6 units (embedding, 4 blocks, head) run as 3 and 3 at p=2 and as 2, 2, 1, 1
    at 4 stages, so a candidate's stage may hold units of both run stages: a plan from the p=2
    run predicts the interleaved v=2 candidate's peak saved bytes per rank as its printed
    command measures them, each unit taking its share of its run stage by the bytes it saves
    (a block's, a third of that for the head, next to nothing for the embedding; cut in halves
    of the run's stages, rank 1 came out 28% short). The same plan refuses the split-backward
    schedules and names the run that measures them: that run stores on every stage (under auto
    ZB-H1's first stage would run whole and measure no W), so a plan from it refuses none. The
    peaks add the weights the run measured (`param_bytes`), regrouped alike."""
    first = ppx("run", *KINDS["llama"], *SHORT, f"run.dir={tmp_path / 'calib'}")
    assert first.returncode == 0, first.stderr[-3000:]
    r = ppx("plan", "--from-run", str(tmp_path / "calib"), "-v", "2", "-m", "4", "--out", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    weights = plan["inputs"]["unit_weights"]
    assert weights["flops"][0] == 0 and len(set(weights["saved_bytes"][1:-1])) == 1, weights
    assert weights["saved_bytes"][-1] < 0.5 * weights["saved_bytes"][1]
    (c,) = [c for c in plan["candidates"] if c["schedule"] == "interleaved_1f1b" and c["v"] == 2]
    ran = ppx("run", *c["command"].split()[2:], "train.steps=2", f"run.dir={tmp_path / 'v2'}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    # the peak adds what the rank's weights hold (weights, gradients, AdamW's two states),
    # from the p=2 run's param_bytes regrouped by the units' parameter bytes: the v=2 run's own
    assert RunDir(tmp_path / "v2").config.train.optimizer == "adamw"
    assert c["peak_bytes"] == pytest.approx(measured_peaks(tmp_path / "v2"), rel=0.05), c["peak_bytes"]

    (named,) = re.findall(r"measure them with `(ppx run [^`]+)`", r.stdout)
    # the run's own config with ZB-H1 beside it, step by step: one run, both measured
    assert """'run.paired=["pipeline.schedule=zb_h1 train.split_backward=store"]'""" in named
    assert "costs include its first step (train.steps=3" in r.stdout  # a short run: said so
    split = ppx("run", *shlex.split(named)[2:], *SHORT, f"run.dir={tmp_path / 'split'}")
    assert split.returncode == 0, split.stderr[-3000:]
    row = read_json(tmp_path / "split" / "summary.json")["paired"]["pipeline.schedule=zb_h1 train.split_backward=store"]
    assert {"0I", "0W", "1I", "1W"} <= set(row["cost_samples"]["action_s"]), row
    assert {w["mode"] for w in row["split_backward"].values()} == {"store"}, row["split_backward"]
    again = ppx("plan", "--from-run", str(tmp_path / "split"), "-v", "2", "--out", str(tmp_path / "plan2"))
    assert again.returncode == 0, again.stderr
    plan = json.loads((tmp_path / "plan2" / "plan.json").read_text())
    assert not [x for x in plan["skipped"] if x["reason"].startswith(SPLIT_REASON)], plan["skipped"]
    assert {"zb_h1", "zbv", "zb_auto", "interleaved_zb"} <= {c["schedule"] for c in plan["candidates"]}
    assert "measure them with" not in again.stdout
    assert "I and W on stages 0, 1 from 'pipeline.schedule=zb_h1 train.split_backward=store'" in again.stdout
    # its B's are the run's own 1F1B's, its I's and W's the entry's: every split list planned at both
    # (both with the machine's stalls left out, as the plan leaves them out: a 3-step run's one stall
    # once put a B at twice its mean)
    inputs, own = plan["inputs"], read_json(tmp_path / "split" / "summary.json")["cost_samples"]["action_s"]
    priced = run_costs(RunDir(tmp_path / "split"))
    means, drawn = priced.measured_costs["action_s"], priced.cost_samples["action_s"]
    assert inputs["whole_s"] == pytest.approx([means["0B"], means["1B"]], rel=1e-4)
    assert all(set(drawn[k]) <= set(own[k]) for k in ("0B", "1B")), (drawn, own)  # the run's own B's
    lent = row["cost_samples"]["action_s"]
    assert inputs["wgrad_s"] == pytest.approx([means["0W"], means["1W"]], rel=1e-4)
    assert all(min(lent[k]) <= means[k] <= max(lent[k]) for k in ("0W", "1W"))
    assert any(c["schedule"].endswith("+drain") for c in plan["candidates"])
    # its measuring command holds three lists at the run's p and m at least (1F1B, the run's own, among them or beside)
    line = next(x for x in again.stdout.splitlines() if "jobs pooled: ppx sweep " in x)
    value = next(w for w in shlex.split(line.split("jobs pooled: ", 1)[1]) if w.startswith("run.paired="))
    assert len({(c["p"], c["m"]) for c in plan["candidates"]}) == 1  # (every one at the run's p and m)
    assert value.count("pipeline.schedule=") >= 3, value
    assert inputs["input_share"] == pytest.approx(row["input_freed_share"]) and 0 < min(row["input_freed_share"]) < 1


def test_a_zbv_entry_beside_a_1f1b_run_prices_the_plans_zbv_as_it_ran(tmp_path):
    """ZB-V (4 stages) measured beside a 1F1B llama run (2) by run.paired: the plan times its
    ZB-V candidate on the entry's own actions, not on the run's stages regrouped (which miss what
    each stage's call costs besides its layers' share), says so, and holds it against the
    entry's measured step."""
    paired = 'run.paired=["pipeline.schedule=zb_h1 train.split_backward=store","pipeline.schedule=zbv"]'
    run = ppx("run", *KINDS["llama"], *SHORT, paired, f"run.dir={tmp_path / 'calib'}")
    assert run.returncode == 0, run.stderr[-3000:]
    r = ppx("plan", "--from-run", str(tmp_path / "calib"), "--schedules", "1f1b,zbv", "--out", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr
    assert "every action at 4 stages from 'pipeline.schedule=zbv'" in r.stdout
    assert "run more stages than" not in r.stdout  # (no candidate regrouped)
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    units = read_json(tmp_path / "calib" / "summary.json")["paired"]["pipeline.schedule=zbv"]["units_per_stage"]
    assert plan["inputs"]["measured_at"] == [{"stages": 4, "units": units, "sources": ["pipeline.schedule=zbv"]}]
    assert "zbv" in {c["schedule"] for c in plan["candidates"]}
    assert "zbv ('pipeline.schedule=zbv') measured " in r.stdout  # beside its prediction
    # ppx simulate --from-run takes the same: ZB-V at its 4 stages, from what the entry ran
    sim = ppx("simulate", "zbv", "--from-run", str(tmp_path / "calib"))
    assert sim.returncode == 0, sim.stderr
    assert "note: 4 stages from what 'pipeline.schedule=zbv' ran beside" in sim.stdout
    assert "zbv: 2 ranks, 4 stages, 4 microbatches" in sim.stdout
    assert re.search(r"beside it, 'pipeline.schedule=zbv' ran this list: step [\d.]+ ms \(median of", sim.stdout)
    inter = ppx("simulate", "interleaved_1f1b", "--virtual", "2", "--from-run", str(tmp_path / "calib"))
    assert inter.returncode == 0 and "beside it," not in inter.stdout  # (no entry ran this list)
    assert "cost the I + W that 'pipeline.schedule=zbv' ran there" in inter.stdout  # (its B's: none ran one)
    four = ppx("simulate", "zbv", "--stages", "4", "--from-run", str(tmp_path / "calib"))
    assert four.returncode != 0 and "leave out --stages or give 2" in four.stderr
    other = ppx("simulate", "interleaved_1f1b", "--virtual", "3", "--from-run", str(tmp_path / "calib"))
    assert other.returncode != 0 and "ran 2 ranks with 1 stage each" in other.stderr  # (no entry at 6 stages)


def test_known_cost_lists_at_three_stages_per_rank(tmp_path):
    calib = KINDS["synthetic"] + ["pipeline.schedule=zb_h1"]
    r, plan, s = plan_and_run(tmp_path, calib, "-v", "3", "--schedules", "interleaved_zb", "-m", "4")
    assert plan["best"]["v"] == 3 and s["stages"] == 6
    assert "model.fwd_ms=[1.33333,1.33333,1.33333,2,2,2]" in printed(r.stdout)


def test_a_flags_plan_runs_as_printed(tmp_path):
    r = ppx(
        "plan",
        "-p",
        "2",
        "-m",
        "4",
        "--fwd-ms",
        "4,6",
        "--bwd-ms",
        "4",
        "--wgrad-ms",
        "2",
        "-v",
        "3",
        "--schedules",
        "interleaved_zb,zb_auto",
        "--out",
        str(tmp_path / "plan"),
    )
    assert r.returncode == 0, r.stderr
    assert "note: assumed 0 ms of runtime overhead per action and 0 ms per hand-off" in r.stdout
    words = printed(r.stdout)
    assert words[2] == "1f1b_2cpu"
    run = ppx("run", *words[2:], "train.steps=2", f"run.dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_plans_measuring_command_runs_as_printed_and_its_jobs_pool(tmp_path):
    """A plan from a known-cost 1F1B run predicts GPipe as fast as 1F1B (equal costs, equal
    bubble): the sweep it prints holds the two beside each other, the run's own config the
    floor, and its comparison pools the jobs."""
    run = ppx("run", *KINDS["synthetic"], *SHORT, f"run.dir={tmp_path / 'calib'}")
    assert run.returncode == 0, run.stderr[-3000:]
    r = ppx(
        "plan",
        "--from-run",
        str(tmp_path / "calib"),
        "-m",
        "4",
        "--schedules",
        "1f1b,gpipe",
        "--out",
        str(tmp_path / "plan"),
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "jobs pooled: ppx sweep " in x)
    words = shlex.split(line.split("jobs pooled: ", 1)[1].split("; left out")[0])  # as a shell reads it
    assert words[:5] == ["ppx", "sweep", str(tmp_path / "calib" / "config.yaml"), "--repeat", "5"]
    assert words[5].startswith("run.paired=[") and "pipeline.schedule=gpipe" in words[5]
    assert words[6:] == ["train.steps=40"]  # the run's 3 steps would give too few pairs
    swept = ppx(*words[1:3], "--repeat", "2", words[5], "train.steps=2", f"run.root={tmp_path / 'runs'}")
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert "note: 2 jobs of one config and run.paired (repeat=1, repeat=2)" in swept.stdout
