"""Sizes no machine runs are refused in one line before anything is built: a model of more
layers than ppx builds (ppx split of 10^9 layers allocated lists until the OOM killer ended
it), a plan of more stages than a list holds; and a plan that takes long says so as it goes."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

from helpers import REPO, ppx

LAYERS = "ppx builds models of at most 1024 layers (each a module of its own, split by FLOPs in a time that grows with their square)"


def test_a_model_of_more_layers_than_ppx_builds_is_refused(tmp_path):
    for args in (
        ["split", "1f1b_2cpu", "model.layers=10000000"],  # (10^7: 5 s and 1 GB of lists before; 10^9 the OOM killer)
        ["split", "llama_tiny_1f1b_2cpu", "model.layers=100000"],  # (a split by FLOPs: quadratic, hours)
        ["run", "1f1b_2cpu", "model.layers=1000000000", f"run.dir={tmp_path / 'run'}"],
    ):
        r = ppx(*args, timeout=60)
        n = args[2].split("=")[1]
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"ppx: error: model.layers={n}: {LAYERS}\n"), args
    assert not (tmp_path / "run").exists()
    r = ppx("split", "1f1b_2cpu", "model.layers=1024")  # the most: split at once
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("units per stage 512, 512: "), r.stderr


def test_a_plan_of_more_stages_than_a_list_holds_is_refused(tmp_path):
    """Its cost lists, one value per stage, were made first (10^9 stages: a MemoryError)."""
    r = ppx("plan", "--fwd-ms", "1", "--bwd-ms", "2", "-p", "10000000", "--out", str(tmp_path / "p"), timeout=60)
    said = "--stages 10000000: ppx builds lists of at most 262144 stage-microbatches, so of at most 262144 stages"
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"ppx: error: {said}\n")
    assert not (tmp_path / "p").exists()


def test_a_long_plan_says_so_at_once_and_a_short_one_says_nothing_more(tmp_path):
    """595 candidates of 16 million stage-microbatches printed nothing for minutes."""
    many = ["--per-layer", "--fwd-ms", ",".join(["1"] * 64), "--bwd-ms", "2", "--stages", "2,4,8,16,32,64"]
    cmd = [sys.executable, "-m", "ppx.cli", "plan", *many, "-m", "64,128,256,512,1024,2048,4096", "--jobs", "1"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "p")], cwd=REPO, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 60)
        first = proc.stderr.readline() if ready else ""
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # (its group: the plan and its pool)
        proc.wait()
    assert first == (
        "ppx plan: 595 candidates of 16304768 stage-microbatches in all (p x v x m each) to build and simulate over "
        "1 process: this takes a while (fewer or smaller --stages, --microbatches or --schedules take less); "
        "progress every tenth\n"
    )
    r = ppx("plan", "--fwd-ms", "1", "--bwd-ms", "2", "-p", "2", "-m", "4", "--out", str(tmp_path / "short"))
    assert (r.returncode, r.stderr) == (0, "") and r.stdout.startswith("ppx plan: ")
