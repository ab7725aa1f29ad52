"""env.json's git state reads the checkout and writes nothing to it."""

from __future__ import annotations

import os
import subprocess

from ppx.launch.environment import git_state


def _git(repo, *args) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def test_git_state_leaves_the_index_alone(tmp_path):
    """A file whose stat changed, its content not: ``git status`` refreshed the index (under
    index.lock, which a git ended mid-write, a run's file-size limit or the job killed, left
    behind: every later git command of the user's failed); now the index is not written."""
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "a")
    os.utime(tmp_path / "a.py", (1_000_000_000, 1_000_000_000))  # stat changed, content the same
    index = tmp_path / ".git" / "index"
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    state = git_state(tmp_path)
    assert state == {"commit": _git(tmp_path, "rev-parse", "HEAD").strip(), "dirty": False}
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
