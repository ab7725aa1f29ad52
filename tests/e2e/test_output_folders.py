"""A folder a command makes for its files (compare --out, plan --out, gpu-check --out) is new
or empty: one that holds files, or a link that leads nowhere, is refused in one line before
any work, and what is there is left as it was; a run directory no file system or file takes,
the same."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ppx
from helpers.run import PICTURED_1F1B


def test_compare_refuses_a_folder_that_holds_files(shared_run, tmp_path):
    """It replaced a report.html or compare.png there (only a folder holding compare.md was
    refused); a file is named as one, a run's own as the run's."""
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
    mine = tmp_path / "notes.txt"  # a plain file: said so (it read "a run's folder or a file")
    mine.write_text("mine")
    r = ppx("compare", str(run), "--out", str(mine))
    said = f"ppx: error: --out {mine} is a file; give a folder for the comparison (a new one)\n"
    assert (r.returncode, r.stderr, mine.read_text()) == (2, said, "mine")
    inside = ppx("compare", str(run), "--out", str(run / "summary.json"))
    assert f"is a file inside the run {run}; ppx never writes into a run" in inside.stderr, inside.stderr
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


def test_a_run_directory_named_so_no_file_system_or_file_takes_it_is_one_line_naming_the_key(tmp_path):
    """A name past the file system's 255 bytes (refused before any folder is made, where the
    folders above it are new too), a byte that is not UTF-8, and a current folder deleted
    under the shell: each one line naming what to change."""
    long = tmp_path / ("x" * 300)
    r = ppx("run", "gpipe_2cpu", f"run.dir={long}", timeout=60)
    assert r.returncode == 2 and r.stderr == (
        f"ppx: error: run.dir={long}: File name too long; a name of 300 bytes, at most 255\n"
    ), r.stderr
    deep = tmp_path / "new" / ("y" * 256) / "run"  # (Python's checks stop at new, missing: they found it free)
    r = ppx("run", "gpipe_2cpu", f"run.dir={deep}", timeout=60)
    assert r.returncode == 2 and r.stderr == (
        f"ppx: error: run.dir={deep}: File name too long; a name of 256 bytes, at most 255\n"
    ), r.stderr
    assert list(tmp_path.iterdir()) == []  # (new was made on the way, and left, before)
    odd = str(tmp_path / "a") + "\udcffb"  # (the byte 0xff as Python keeps it; the process gets the byte)
    r = ppx("run", "gpipe_2cpu", f"run.dir={odd}", timeout=60)
    assert r.returncode == 2 and r.stderr == (
        f"ppx: error: run.dir={tmp_path}/a\\xffb: a byte that is not UTF-8 (\\xff); ppx writes its arguments "
        "into UTF-8 files (config.yaml): give it in UTF-8\n"
    ), r.stderr
    gone = tmp_path / "gone"
    gone.mkdir()
    cmd = f"cd {gone} && rmdir {gone} && exec {sys.executable} -m ppx.cli run gpipe_2cpu run.root={tmp_path}"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == (
        "ppx: error: the current folder no longer exists (deleted after the shell entered it): cd to one that does\n"
    ), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_folders_a_failed_claim_made_are_removed(tmp_path):
    """A claim that fails part way down a path of new folders (here a file system out of
    inodes after three, in a mount namespace of this test's own) leaves none of them."""
    root = tmp_path / "small"
    root.mkdir()
    run = root / "a" / "b" / "c" / "d"
    ppx_run = f"{sys.executable} -m ppx.cli run gpipe_2cpu run.dir={run}"
    inner = f"mount -t tmpfs -o nr_inodes=4,size=1m tmpfs {root} && {{ {ppx_run}; echo rc=$?; ls -A {root}; }}"
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if "mount:" in r.stderr or "unshare:" in r.stderr:
        pytest.skip(f"no mount namespace of its own here: {r.stderr.strip()}")
    assert r.stderr == f"ppx: error: run.dir={run}: cannot create it (No space left on device)\n", r.stderr
    assert r.stdout == "rc=2\n", r.stdout  # (ls of the mount: nothing; a/b/c were left before)
