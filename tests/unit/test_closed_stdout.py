"""Standard streams closed when ``ppx`` starts: each opened on /dev/null, where Python's
sys.stdout / sys.stderr write and a child process finds the descriptor open (one closed
alone here; all three under a whole ``ppx run``: tests/e2e/test_run.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = """
import os, subprocess, sys
from ppx.launch.closed_stdout import open_closed_std_streams
open_closed_std_streams()
print("out", flush=True)
print("err", file=sys.stderr, flush=True)
child = "import os, sys; [os.fstat(fd) for fd in (0, 1, 2)]; print('child', flush=True)"
sys.exit(subprocess.run([sys.executable, "-c", child]).returncode)
"""


@pytest.mark.parametrize("closed", [(0,), (1,), (2,), (1, 2)])
def test_a_closed_standard_stream_is_dev_null_here_and_in_children(tmp_path, closed):
    r = subprocess.run(
        [sys.executable, "-c", CHILD],
        preexec_fn=lambda: [os.close(fd) for fd in closed],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("" if 1 in closed else "out\nchild\n"), r.stdout
    assert r.stderr == ("" if 2 in closed else "err\n"), r.stderr
