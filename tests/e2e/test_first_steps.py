"""A new user's first commands, as a review found them: each slip answered in one line
``ppx: error: ...`` (exit 2) that names what was given, before any work."""

from __future__ import annotations

from helpers import ppx


def test_compare_refuses_a_path_that_is_no_run_nor_holds_one(tmp_path):
    """`ppx compare docs README.md <run>` compared the one run and said nothing of the others."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# mine\n")
    run = tmp_path / "runs" / "gpipe_2cpu" / "20260101-000000"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    for given, first in ((["docs", "README.md"], "docs"), (["README.md"], "README.md")):
        r = ppx("compare", *given, str(run.relative_to(tmp_path)), "--out", "cmp", cwd=tmp_path, timeout=60)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr == f"ppx: error: {first} is neither a run (a folder with summary.json) nor a folder of runs\n"
        assert not (tmp_path / "cmp").exists()
    # a glob's matches that are no runs are passed over, as before (a glob picks the runs of a folder)
    r = ppx("compare", "READ*", "doc[s]", "--out", "cmp", cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stderr) == (2, "ppx: error: no completed run (summary.json) under READ* doc[s]\n")
