"""ppx never writes into a run: every command that writes a file or a folder refuses a path
inside a run directory, in one line before any work; and a run's config.yaml that this ppx
cannot read is one line, not a traceback."""

from __future__ import annotations

import shutil

from helpers import ppx
from helpers.run import PICTURED_1F1B


def _files(folder):
    return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_no_command_writes_into_a_run(shared_run):
    run = shared_run(*PICTURED_1F1B).dir  # read only: shared with other files
    before = _files(run)
    inside = f"is inside the run {run}; ppx never writes into a run"
    cases = [
        (["schedule", "1f1b", "-p", "2", "-m", "4", "--csv", str(run / "x.csv")], f"--csv {run / 'x.csv'} {inside}"),
        (["simulate", "1f1b", "--png", str(run / "timeline.png")], f"--png {run / 'timeline.png'} {inside}"),
        (
            ["plan", "--fwd-ms", "10", "--bwd-ms", "20", "-p", "2", "-m", "4", "--out", str(run / "plan")],
            f"--out {run / 'plan'} {inside}",
        ),
        (["run", "1f1b_2cpu", f"run.dir={run / 'status' / 'x'}"], f"the run would go inside the run {run}"),
        (["run", "1f1b_2cpu", f"run.root={run}", "run.name=tb"], f"the run would go inside the run {run}"),
        (["sweep", "1f1b_2cpu", "--sweep", "pipeline.microbatches=2,4", f"run.root={run}"], "inside the run"),
        (["gpu-check", "--on-cpu", "--only", "timers", "--out", str(run / "gc")], f"--out {run / 'gc'} {inside}"),
        (["gpu-check", "--dry-run", "--out", str(run / "gc")], f"--out {run / 'gc'} {inside}"),
    ]
    for args, said in cases:
        r = ppx(*args, timeout=60)
        assert (r.returncode, r.stdout) == (2, ""), (args, r.stdout, r.stderr)
        assert r.stderr.startswith("ppx: error: ") and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert _files(run) == before


def test_a_file_named_outside_a_run_that_leads_into_one_is_refused(shared_run, tmp_path):
    """A link elsewhere to a run's file, or to a file a run does not have yet: where it leads counts."""
    run = shared_run(*PICTURED_1F1B).dir  # read only: shared with other files
    before = _files(run)
    (tmp_path / "config.csv").symlink_to(run / "config.yaml")
    (tmp_path / "new.png").symlink_to(run / "new.png")
    for args in (
        ["schedule", "1f1b", "-p", "2", "-m", "4", "--csv", str(tmp_path / "config.csv")],
        ["simulate", "1f1b", "--png", str(tmp_path / "new.png")],
    ):
        r = ppx(*args, timeout=60)
        assert (r.returncode, r.stdout) == (2, ""), (args, r.stdout, r.stderr)
        assert f"is inside the run {run}; ppx never writes into a run" in r.stderr and r.stderr.count("\n") == 1
    assert _files(run) == before


def test_an_empty_plan_out_is_refused_not_taken_for_the_default(tmp_path):
    r = ppx("plan", "--fwd-ms", "1", "--bwd-ms", "2", "-p", "2", "-m", "4", "--out", "", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "ppx: error: --out is empty: give a folder's path (or leave --out out: plans/<UTC time>)\n",
    )
    assert not (tmp_path / "plans").exists()


def test_a_picture_of_a_format_matplotlib_does_not_draw_is_refused_before_the_work(tmp_path):
    r = ppx("simulate", "1f1b", "--png", str(tmp_path / "x.txt"))
    assert (r.returncode, r.stdout) == (2, "")  # (it printed the simulation, then matplotlib's traceback)
    assert r.stderr.startswith(f"ppx: error: --png {tmp_path / 'x.txt'}: name a picture file, e.g. .png (or ")
    r = ppx("simulate", "1f1b", "--png", str(tmp_path / "x.svg"))  # another format it draws: drawn
    assert r.returncode == 0 and (tmp_path / "x.svg").read_text().startswith("<?xml"), r.stderr


def test_a_runs_config_this_ppx_cannot_read_is_one_line(shared_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(shared_run(*PICTURED_1F1B).dir, run)
    with open(run / "config.yaml", "a") as f:
        f.write("from_another_version: {a: 1}\n")  # (a run of a later ppx)
    said = f"ppx: error: {run}/config.yaml: this ppx cannot read it (Key 'from_another_version' not in 'Config')\n"
    for args in (
        ["simulate", "1f1b", "--from-run", str(run)],
        ["plan", "--from-run", str(run), "--out", str(tmp_path / "p")],
    ):
        r = ppx(*args, timeout=120)
        assert (r.returncode, r.stderr) == (2, said), r.stderr[-2000:]
    (run / "config.yaml").write_text("")
    r = ppx("simulate", "1f1b", "--from-run", str(run))
    assert (r.returncode, r.stderr) == (2, f"ppx: error: {run}/config.yaml is empty\n")  # (it simulated the defaults)
    (run / "summary.json").write_bytes(b"\xff\xfe")  # (no text: a traceback before)
    for args in (["compare", str(run)], ["plan", "--from-run", str(run), "--out", str(tmp_path / "p2")]):
        r = ppx(*args, timeout=120)
        assert (r.returncode, r.stderr) == (
            2,
            f"ppx: error: {run}/summary.json is not text (invalid start byte at byte 0)\n",
        )
