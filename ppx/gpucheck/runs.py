"""The ``ppx run``s the checks read: each one a real run in a process of its own, its config
written as a YAML experiment beside it, its output kept, its run directory read back.

``<out>/configs/<name>.yaml`` (and a schedule CSV where the run takes one) is what ran:
``ppx run <out>/configs/<name>.yaml run.dir=<out>/runs/<name>`` repeats it. A run's output
goes to ``<out>/runs/<name>.log``. A run is started only if its estimate fits in the time
left, and stopped (its process group, torchrun's ranks with it) when the time is up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from ppx.config import SUMMARY_ONLY, as_overrides
from ppx.errors import UserError
from ppx.files import write_whole
from ppx.gpucheck.machine import Machine
from ppx.report.run_dir import RunDir

# every run: no W&B, no TensorBoard, no pictures or report.html (nothing reads them here), a
# watchdog that allows a GPU's first steps their cuBLAS and NCCL set-up
COMMON = {**SUMMARY_ONLY, "logging.tensorboard": False, "runtime.timeout_s": 120}


@dataclass(frozen=True)
class RunSpec:
    """One run: ``name`` (its folder and experiment name), its config ``keys`` (dotted key ->
    value), ``processes`` (pipeline ranks), the expected wall time ``estimate_s`` and, for a
    run of a schedule CSV, the CSV's text (``pipeline.schedule`` then points at it)."""

    name: str
    keys: tuple
    processes: int
    estimate_s: float
    csv: str | None = None

    @classmethod
    def of(cls, name: str, keys: dict, estimate_s: float, csv: str | None = None) -> RunSpec:
        return cls(name, tuple(keys.items()), int(keys["pipeline.stages"]), float(estimate_s), csv)

    def key(self, name: str, default=None):
        return dict(self.keys).get(name, default)


@dataclass
class RunResult:
    """What became of a run: ``dir`` when it completed, else ``why`` (``budget`` True when it
    was not started for lack of time)."""

    spec: RunSpec
    dir: RunDir | None = None
    why: str | None = None
    budget: bool = False
    wall_s: float | None = None
    command: str = ""
    log: str = ""

    def as_dict(self) -> dict:
        return {
            "name": self.spec.name,
            "command": self.command,
            "run_dir": str(self.dir.path) if self.dir else None,
            "log": self.log,
            "wall_s": None if self.wall_s is None else round(self.wall_s, 1),
            "estimate_s": round(self.spec.estimate_s, 1),
            "ok": self.dir is not None,
            "why": self.why,
        }


class Runner:
    """Runs specs once each (a name asked for twice with the same spec is the same run),
    in ``out``, before ``deadline`` (time.monotonic() seconds)."""

    def __init__(self, out: Path, machine: Machine, deadline: float, echo: Callable[[str], None] = print):
        self.out, self.machine, self.deadline, self.echo = out, machine, deadline, echo
        self.done: dict[str, RunResult] = {}
        self.checked: dict[RunSpec, str | None] = {}  # a run two checks plan alike is checked once
        self.count = 0

    def keys(self, spec: RunSpec) -> dict:
        keys = {**COMMON, "runtime.device": self.machine.device, **dict(spec.keys)}
        if spec.csv is not None:
            keys["pipeline.schedule"] = str(self.path(spec, ".csv"))
        return keys

    def path(self, spec: RunSpec, suffix: str) -> Path:
        return self.out / "configs" / f"{spec.name}{suffix}"

    def prepare(self, spec: RunSpec) -> Path:
        """Write the run's YAML (and CSV); returns the YAML's path."""
        (self.out / "configs").mkdir(parents=True, exist_ok=True)
        if spec.csv is not None:
            write_whole(self.path(spec, ".csv"), spec.csv)
        yaml = self.path(spec, ".yaml")
        write_whole(yaml, OmegaConf.to_yaml(OmegaConf.from_dotlist(as_overrides(self.keys(spec)))))
        return yaml

    def check(self, spec: RunSpec) -> str | None:
        """The config error a run would stop at (one line), or None: checked before any run."""
        from ppx import config
        from ppx.config import resolve_schedule

        if spec not in self.checked:
            try:
                resolve_schedule(config.load(str(self.prepare(spec))))
                self.checked[spec] = None
            except UserError as e:
                self.checked[spec] = f"{spec.name}: {e}"
        return self.checked[spec]

    def run(self, spec: RunSpec) -> RunResult:
        if spec.name in self.done:
            if self.done[spec.name].spec != spec:
                raise ValueError(f"two different runs named {spec.name}")
            return self.done[spec.name]
        result = self._run(spec)
        self.done[spec.name] = result
        return result

    def _run(self, spec: RunSpec) -> RunResult:
        yaml = self.prepare(spec)
        run_dir = self.out / "runs" / spec.name
        log = self.out / "runs" / f"{spec.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["ppx", "run", str(yaml.relative_to(self.out)), f"run.dir={run_dir.relative_to(self.out)}"]
        result = RunResult(spec, command=" ".join(cmd), log=str(log.relative_to(self.out)))
        left = self.deadline - time.monotonic()
        if spec.estimate_s > left:
            result.why, result.budget = (
                f"time budget: {left:.0f} s left, the run needs about {spec.estimate_s:.0f} s",
                True,
            )
            self.echo(f"ppx gpu-check: {spec.name}: not run ({result.why})")
            return result
        self.count += 1
        env = dict(os.environ)
        if not self.machine.cuda:
            env["CUDA_VISIBLE_DEVICES"] = ""
        limit = min(left, max(120.0, 4 * spec.estimate_s))
        start = time.monotonic()
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ppx.cli", *cmd[1:]],
                cwd=self.out,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped whole, torchrun's ranks included
            )
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _stop(proc)
                rc = None
            except BaseException:
                _stop(proc)
                raise
        result.wall_s = time.monotonic() - start
        device = self.keys(spec)["runtime.device"]
        if rc == 0 and (run_dir / "summary.json").exists():
            ran_on = RunDir(run_dir).raw_summary.get("device", "")
            if ran_on.split(":")[0] == device:
                result.dir = RunDir(run_dir)
            else:  # never judge a CPU run as a GPU one
                result.why = f"ran on {ran_on}, not {device}"
        elif rc is None:
            result.why = f"stopped after {limit:.0f} s (its estimate {spec.estimate_s:.0f} s); see {result.log}"
        else:
            result.why = f"exit {rc}: {_last_error(log)} (see {result.log})"
        state = "ok" if result.dir else f"FAILED: {result.why}"
        self.echo(f"ppx gpu-check: run {self.count} {spec.name}: {result.wall_s:.1f} s, {state}")
        return result


class Missing(Exception):
    """A run a check reads did not complete."""

    def __init__(self, result: RunResult):
        super().__init__(result.why)
        self.result = result


class Runs:
    """name -> the completed run's `RunDir`; `Missing` for one that is not."""

    def __init__(self, runner: Runner):
        self.runner = runner

    def __getitem__(self, name: str):
        result = self.runner.done[name]
        if result.dir is None:
            raise Missing(result)
        return result.dir


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group (ppx run ends its torchrun job on it), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_error(log: Path) -> str:
    """The run's one-line error (``ppx: error: ...``), else its last line."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("ppx: error:")]
    return (errors or lines or ["no output"])[-1][:300]
