"""Run the real ``ppx`` command in a subprocess, find free ports, read a run's JSON files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import machine, served_cli
from ppx.config import SUMMARY_ONLY, as_overrides

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"  # schedule CSVs the tests read


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet(args: tuple[str, ...]) -> tuple[str, ...]:
    """A ``ppx run``'s (or ``ppx sweep``'s) arguments without what no test reads unless it
    names it: W&B (about 2 s a run) and the pictures and report.html (about 1.5 s). The tests of
    W&B, the pictures and the page name the key (``logging.wandb.mode=offline``,
    ``logging.report=true``)."""
    for override in as_overrides(SUMMARY_ONLY):
        key = override.split("=", 1)[0]
        if not any(a.startswith(f"{key}=") for a in args):
            args = (*args, override)
    return args


def ppx(*args: str, timeout: float = 240, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``python -m ppx.cli <args>`` as a user would, and capture its output (a ``ppx run``
    and a sweep's points `quiet` unless the test names the keys): forked from the session's
    command server where it serves the command (`helpers.served_cli`), else a new process."""
    if args[:1] in (("run",), ("sweep",)):
        args = quiet(args)
    full_env = dict(os.environ, **(env or {}))
    command = [sys.executable, "-m", "ppx.cli", *args]
    start = time.monotonic()
    served = served_cli.served_run(command, full_env, cwd, timeout)
    if served is not None:
        return served
    left = max(timeout - (time.monotonic() - start), 1.0)  # (the server's answer counted)
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=left)


def run_args(command: str) -> list[str]:
    """The arguments of a printed `ppx run` command (``command``: the line, or a command's
    whole output, whose first line starting `ppx run ` is taken) without its run.dir: a test
    runs it under a folder of its own."""
    line = next(x for x in command.splitlines() if x.startswith("ppx run "))
    return [a for a in line.split()[2:] if not a.startswith("run.dir=")]


def torchrun_ppx(nproc: int, *args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """``ppx <args>`` in each of ``nproc`` processes started by torchrun itself (as under srun or
    a user's own torchrun: no `ppx run` launcher around them), its output captured (``env``:
    added to this process's environment)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "ppx.cli"]
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([*cmd, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# 1F1B on 2 ranks, 3 steps, with its pictures and report.html: test_tb_pictures, test_browser,
# test_beyond_1f1b's ppx-vs-torch 1F1B comparison, test_run's default run directory and
# test_bad_input's simulate --from-run read this one run (shared_run)
PICTURED_1F1B = ("1f1b_2cpu", "train.steps=3", "logging.report=true")

# 1F1B on 2 ranks profiled at steps 2 and 3 of 5 (wait 1, warmup 1, active 2), logged to W&B
# offline (the default mode): tests/e2e/test_logging.py's TensorBoard and W&B tests and
# tests/e2e/test_instrumentation.py's profiler traces read this one run (shared_run). The
# known-cost model (1 ms forwards, 2 ms backwards, slept): ranks that wait leave the CPU free,
# so they start each step together (test_instrumentation holds the step to 1% of the longest rank's)
PROFILED_1F1B = (
    "1f1b_2cpu",
    "model.kind=synthetic",
    "model.hidden=16",
    "model.fwd_ms=1",
    "model.bwd_ms=2",
    "train.steps=5",
    "profile.enabled=true",
    "profile.wait=1",
    "profile.warmup=1",
    "profile.active=2",
    "logging.wandb.mode=offline",
    "logging.report=true",
)


@dataclass(frozen=True)
class SharedRun:
    """One finished ``ppx run``: its run directory, the ``run.root`` it was made under (the
    default place, ``<root>/<experiment>/<timestamp>``) and the finished process."""

    dir: Path
    root: Path
    result: subprocess.CompletedProcess


class SharedRuns:
    """``ppx run <experiment> <overrides>`` once per session (per xdist worker) for every test
    that only reads the run (conftest.py's ``shared_run`` fixture): the same arguments, the same
    run. Each run goes to the default run directory under a ``run.root`` of its own. A run that
    fails fails every test that asks for it, with its error, without running again. A run made
    beside another test does not serve a ``timing`` test, which runs its own, alone
    (tests/helpers/machine.py)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.done: dict[tuple[str, ...], tuple[SharedRun | str, bool]] = {}  # key -> (run, made alone)
        self.made = 0

    def __call__(self, experiment: str, *overrides: str) -> SharedRun:
        overrides = quiet(overrides)  # as ppx() would: one key for the same run
        key = (experiment, *overrides)
        if key not in self.done or (machine.alone() and not self.done[key][1]):
            root = self.folder / f"root{self.made}"
            self.made += 1
            r = ppx("run", experiment, *overrides, f"run.root={root}")
            runs = list((root / experiment).iterdir()) if r.returncode == 0 else []
            if len(runs) == 1:
                done = SharedRun(runs[0], root, r)
            else:
                done = f"ppx run {' '.join(key)}: exit {r.returncode}, run directories {runs}\n{r.stderr[-3000:]}"
            self.done[key] = (done, machine.alone())
        done = self.done[key][0]
        assert isinstance(done, SharedRun), done
        return done


def measured_peaks(run: Path) -> list[float]:
    """The run's peak bytes per rank as `ppx plan` predicts them (plan.json's ``peak_bytes``):
    its saved activations and what its weights hold (weights, gradients, optimizer state)."""
    from ppx.measure.weights_held import weights_held_bytes
    from ppx.report.run_dir import RunDir

    run = RunDir(run)
    rows = run.raw_summary["ranks"]
    return [r["peak_activation_bytes"] + weights_held_bytes(r["param_bytes"], run.config.train.optimizer) for r in rows]
