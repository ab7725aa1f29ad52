"""`ppx plan` as a user runs it: bad input is one line and exit 2, a budget nothing fits is
exit 1 with the closest candidate named, the default pool of two processes gives what one
gives, and a plan too large for this machine says it is a prediction for a cluster."""

from __future__ import annotations

import json

from helpers import ppx

COSTS = ["--fwd-ms", "10", "--bwd-ms", "10", "--wgrad-ms", "5"]


def test_malformed_size_is_one_line_exit_2(tmp_path):
    r = ppx("plan", *COSTS, "--mem-budget", "40GiBs", "--out", str(tmp_path / "p"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "ppx: error: --mem-budget '40GiBs': give a size in bytes, e.g. 40GiB, 512MiB, 64KB or 1.5e9"
    ]
    assert not (tmp_path / "p").exists()


def test_from_run_with_cost_flags_is_one_line_exit_2(tmp_path):
    r = ppx("plan", "--from-run", str(tmp_path), "--bwd-ms", "3")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["ppx: error: --from-run takes the run's costs; leave out --bwd-ms"]


def test_nothing_fits_is_exit_1_with_the_closest(tmp_path):
    r = ppx(
        "plan",
        *COSTS,
        "--act-bytes",
        "1GiB",
        "--mem-budget",
        "2GiB",
        "--schedules",
        "gpipe,1f1b",
        "--out",
        str(tmp_path / "p"),
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "ppx: error: nothing fits --mem-budget 2GiB per rank; the closest is 1f1b p=4 m=8 v=1 at 4.00 GiB (2.00 GiB over)"
    ]
    assert (tmp_path / "p" / "plan.md").exists() and not (tmp_path / "p" / "best.csv").exists()


def test_two_processes_plan_what_one_plans(tmp_path):
    args = [*COSTS, "--schedules", "gpipe,1f1b,zb_h1,interleaved_1f1b,looped_bfs", "--microbatches", "8,16"]
    one = ppx("plan", *args, "--jobs", "1", "--out", str(tmp_path / "one"))
    two = ppx("plan", *args, "--out", str(tmp_path / "two"))  # default: min(2, CPUs)
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    cands = [json.loads((tmp_path / d / "plan.json").read_text())["candidates"] for d in ("one", "two")]
    assert cands[0] == cands[1] and len(cands[0]) == 2 * (3 + 3 + 3)
    # interleaved and looped BFS at v = 3, 4 come within 2% of the best: the plan names them
    best = cands[0][0]["microbatches_per_s"]
    close = [c for c in cands[0][1:] if c["fits"] and best / c["microbatches_per_s"] - 1 <= 0.02]
    assert close
    written = json.loads((tmp_path / "one" / "plan.json").read_text())
    assert [cands[0][k] for k in written["close_to_best"]] == close
    note = next(n for n in json.loads((tmp_path / "one" / "plan.json").read_text())["notes"] if "within 2%" in n)
    assert note.startswith("note: " + ", ".join(f"{c['schedule']} p={c['p']} m={c['m']} v={c['v']}" for c in close[:4]))
    assert note in one.stdout and note in (tmp_path / "one" / "plan.md").read_text()


def test_a_cluster_sized_plan_says_so(tmp_path):
    r = ppx(
        "plan",
        "--per-layer",
        "--fwd-ms",
        ",".join(["1"] * 64),
        "--bwd-ms",
        "1",
        "--stages",
        "4,64",
        "--microbatches",
        "64",
        "--schedules",
        "1f1b",
        "--out",
        str(tmp_path / "p"),
    )
    assert r.returncode == 0, r.stderr
    assert "note: these are predictions for a cluster (up to 64 ranks), not runnable on this machine" in r.stdout
    assert "predictions for a cluster" in (tmp_path / "p" / "plan.md").read_text()
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["notes"][0].startswith("note: these are predictions")


def test_a_plan_cut_short_while_printing_has_written_its_files(tmp_path):
    """`ppx plan ... | head -1`: the reader goes away and the plan dies of its next write to
    the pipe (SIGPIPE). Here the pipe has no reader from the start, so every write fails: the
    files are all written before the first line is (it had died after best.csv, and a retry
    with the same --out was refused: the folder was not empty)."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    out = tmp_path / "plan"
    read, write = os.pipe()
    os.close(read)
    try:
        cmd = [sys.executable, "-m", "ppx.cli", "plan", *COSTS, "--schedules", "1f1b,zb_h1", "--out", str(out)]
        r = subprocess.run(cmd, cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert r.returncode != 0, r.stderr  # it could not print
    assert sorted(p.name for p in out.iterdir()) == ["best.csv", "plan.json", "plan.md", "plan.png"]
    assert json.loads((out / "plan.json").read_text())["best"]["schedule"] in ("1f1b", "zb_h1")
