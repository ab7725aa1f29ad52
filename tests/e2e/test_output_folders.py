"""A folder a command makes for its files (compare --out, plan --out, gpu-check --out) is new
or empty: one that holds files, or a link that leads nowhere, is refused in one line before
any work, and what is there is left as it was."""

from __future__ import annotations

from helpers import ppx
from helpers.run import PICTURED_1F1B


def test_compare_refuses_a_folder_that_holds_files(shared_run, tmp_path):
    """It replaced a report.html or compare.png there (only a folder holding compare.md was refused)."""
    run = shared_run(*PICTURED_1F1B).dir  # read only: shared with other files
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.html").write_text("my page")
    r = ppx("compare", str(run), "--out", str(out))
    assert (r.returncode, r.stdout, r.stderr) == (
        2,
        "",
        f"ppx: error: --out {out} exists and is not empty; give a new folder\n",
    )
    assert [p.name for p in out.iterdir()] == ["report.html"] and (out / "report.html").read_text() == "my page"
    empty = tmp_path / "empty"  # an empty folder takes the comparison
    empty.mkdir()
    r = ppx("compare", str(run), "--out", str(empty))
    assert r.returncode == 0 and (empty / "compare.md").exists(), r.stderr


def test_a_link_to_nothing_is_refused_as_an_output_folder(tmp_path):
    """plan --out said "ppx: error: File exists: <link>" (after its search); gpu-check likewise."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    said = f"ppx: error: --out {link} is a link to {tmp_path / 'nowhere'}, which does not exist; give a new folder\n"
    for args in (
        ["plan", "--fwd-ms", "1", "--bwd-ms", "2", "-p", "2", "-m", "4", "--out", str(link)],
        ["compare", str(tmp_path / "no-run*"), "--out", str(link)],
        ["gpu-check", "--dry-run", "--out", str(link)],
    ):
        r = ppx(*args, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", said), args
    assert not (tmp_path / "nowhere").exists()
