"""Repeated ``run.paired`` jobs: ``ppx sweep --repeat`` runs one config several times, in rounds,
and ``ppx compare`` pools each entry's ratio across the jobs (ppx.measure.paired_jobs); a run
made before ppx marked floors gets its floor named from its config and steps."""

from __future__ import annotations

import json
import math
import shutil

from helpers import ppx, read_json, read_jsonl
from ppx.report.compare_notes import job_paired
from ppx.report.run_dir import RunDir

ENTRIES = ["pipeline.schedule=1f1b", "pipeline.schedule=zb_h1 train.split_backward=drain"]


def test_a_repeated_paired_sweep_is_pooled_and_an_old_run_names_its_floor(tmp_path):
    listed = "[" + ",".join(f'"{e}"' for e in ENTRIES) + "]"
    r = ppx(  # (its runs draw their pages, so the sweep's comparison draws its page too)
        "sweep",
        "1f1b_2cpu",
        "--repeat",
        "2",
        "train.steps=6",
        f"run.paired={listed}",
        f"run.root={tmp_path / 'runs'}",
        "logging.report=true",
    )
    assert r.returncode == 0, r.stderr
    assert "ppx sweep: [1/2] (round 1 of 2)" in r.stdout and "ppx sweep: [2/2] (round 2 of 2)" in r.stdout
    (root,) = (tmp_path / "runs" / "1f1b_2cpu").iterdir()
    jobs = [read_json(root / f"repeat={k}" / "summary.json")["paired"] for k in (1, 2)]
    drain = [job[ENTRIES[1]]["over_floor"] for job in jobs]
    pooled = math.exp(sum(map(math.log, drain)) / 2)
    note = next(line for line in r.stdout.splitlines() if line.startswith("note: 2 jobs of one config"))
    assert "(repeat=1, repeat=2)" in note
    assert "note: beside repeat=" not in r.stdout  # (each job's ratio is in the pooled note: not a note per job too)
    assert f"'{ENTRIES[1]}' (over the floor's) {drain[0]:.3f}, {drain[1]:.3f}: pooled {pooled:.3f}x (" in note
    floor = [job[ENTRIES[0]]["over_run"] for job in jobs]
    assert f"'{ENTRIES[0]}' (the run's own config: the floor, over the run's) {floor[0]:.3f}, {floor[1]:.3f}: " in note
    md = (root / "compare.md").read_text()
    assert note in md  # and a table of the pooled entries, there and in the comparison's page
    assert f"| {ENTRIES[1]} | the floor's | 2 | {drain[0]:.3f}, {drain[1]:.3f} | {pooled:.3f}x | " in md
    assert 'id="pooled-0"' in (root / "report.html").read_text()
    # the same in paired.json, for a script: each job's rows, and the pooled group with its verdict
    data = read_json(root / "paired.json")
    assert data["runs"]["repeat=1"] == jobs[0] and data["runs"]["repeat=2"] == jobs[1]
    (group,) = data["pooled"]
    assert group["runs"] == ["repeat=1", "repeat=2"]
    got = group["entries"][ENTRIES[1]]
    assert got["per_job"] == drain and math.isclose(got["over_pooled"], pooled) and got["against"] == "floor"
    assert got["verdict"] in ("faster", "slower", "not told apart") and got["verdict"] in note
    row = next(line for line in r.stdout.splitlines() if line.startswith(f"{ENTRIES[1]}  "))  # and in the terminal
    assert f"{drain[0]:.3f}, {drain[1]:.3f}  {pooled:.3f}x" in row and row.endswith(got["verdict"]), row

    # a run from before floors: no floor marks in its summary, no paired field in its steps
    old = tmp_path / "old"
    shutil.copytree(root / "repeat=1", old)
    s = read_json(old / "summary.json")
    for row in s["paired"].values():
        for key in ("floor", "floor_entry", "over_floor", "over_floor_ci95"):
            row.pop(key, None)
    (old / "summary.json").write_text(json.dumps(s))
    lines = read_jsonl(old / "metrics.jsonl")
    (old / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in x.items() if k != "paired"}) + "\n" for x in lines)
    )
    r = ppx("compare", str(old), "--out", str(tmp_path / "compared"))
    assert r.returncode == 0, r.stderr
    assert f"'{ENTRIES[0]}' (the run's own config: the floor) " in r.stdout
    assert f"'{ENTRIES[1]}' {drain[0]:.3f}x the floor's (" in r.stdout
    # its files cut short or unreadable: compare goes on with its summary's rows as they are
    for broken, how in (("cut", "metrics.jsonl"), ("bad", "config.yaml")):
        shutil.copytree(old, tmp_path / broken)
        path = tmp_path / broken / how
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]) if how == "metrics.jsonl" else "a: [")
        assert job_paired(RunDir(tmp_path / broken)) == s["paired"]  # no floor named
