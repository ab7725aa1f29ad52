"""Weights & Biases logging from rank 0: offline by default (no account needed; files land in
``<run>/wandb/`` and ``wandb sync`` uploads them later). All W&B work is the W&B writer's
(`ppx.report.wandb_writer`), a process this sink starts and feeds: rank 0 never imports W&B.
An offline run's writer starts once its steps are over (its steps' scalars kept until then); an
online one with the run, so that its charts are live. Logging never kills training:
any W&B failure is reported once and logging goes on offline, or stops."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ppx.report.scalars import run_scalars

SUMMARY_KEYS = (
    "step_time_s",
    "bubble_fraction",
    "bubble_over_ideal",
    "bubble_fraction_theory",
    "bubble_over_ideal_theory",
    "ideal_step_time_s",
    "step_time_over_ideal",
    "status",
)


KEEP_STEPS = 2000  # an offline run past this many steps starts its writer then (its end logs each kept step, ~0.5 ms)


def _warn(msg: str) -> None:
    print(f"ppx: warning: {msg}", file=sys.stderr, flush=True)


def _how(code: int) -> str:
    """How the writer ended, from Popen's return code."""
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


class WandbSink:
    def __init__(self, cfg, run_dir: Path, config_dict: dict, cpus: list | None = None):
        """``cpus``: the CPUs the writer takes once the steps are over (the job's: rank 0 is
        pinned to its own, which the writer keeps until then)."""
        w = cfg.logging.wandb
        # the writer's end awaited at most this long (its files, an upload), within the watchdog's
        # limit for the phase (a set-up phase's: at least 60 s) and after the other ranks are released
        self.wait_s = max(cfg.runtime.timeout_s, 60.0)
        init = dict(
            mode=w.mode,
            project=w.project,
            entity=w.entity,
            group=w.group or cfg.run.name,
            tags=list(w.tags),
            name=f"{cfg.run.name}/{run_dir.name}",
            dir=str(run_dir),
            config=config_dict,
        )
        self.cpus, self.proc, self.started, self.steps = cpus, None, False, 0
        self.kept = [{"init": init}]  # offline: the messages for a writer started once the steps are over
        if w.mode == "online":  # (live: the writer, and W&B, start with the run)
            self._start_writer()

    def _start_writer(self) -> None:
        """The writer started (on rank 0's CPUs) and sent what was kept."""
        self.started = True
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "ppx.report.wandb_writer"], stdin=subprocess.PIPE)
        except OSError as e:
            _warn(f"the W&B writer did not start ({e}); not logging to W&B")
            return
        kept, self.kept = self.kept, []
        for msg in kept:
            self._send(msg)

    def _send(self, msg: dict) -> None:
        if not self.started:
            self.kept.append(msg)
            return
        if self.proc is None:
            return
        try:
            self.proc.stdin.write((json.dumps(msg, default=str) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):  # the writer is gone
            self._lost()

    def _lost(self) -> None:
        """The writer ended before its time: said once (a writer that failed W&B says why and
        goes on reading; one that ends was killed or crashed)."""
        proc, self.proc = self.proc, None
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        _warn(f"the W&B writer ended before the run did ({_how(code)}); not logging to W&B")

    def step(self, step: int, scalars: dict[str, float]) -> None:
        self._send({"step": step, "scalars": scalars})
        self.steps += 1
        if not self.started and self.steps >= KEEP_STEPS:  # (a long run: its end would log them all)
            self._start_writer()
            self._send({"start": True})  # (W&B now, on rank 0's CPUs)

    def start(self) -> None:
        """The run's steps are over: an offline run's writer starts now (a new process beside a
        timed step would take its CPU), and W&B with it, on the job's CPUs, while the report draws."""
        if not self.started:
            self._start_writer()
        self._send({"start": True, "cpus": self.cpus})

    def finish(self, summary: dict, run_dir: Path) -> None:
        """The run's summary to the writer, which logs it with the run's files (`close` awaits it)."""
        end = {
            "run_dir": str(run_dir),
            "summary": {k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None},
            "ranks": summary.get("ranks", []),
            "run_scalars": run_scalars(summary),
        }
        if not self.started:
            self.start()
        self._send({"finish": end})
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def close(self, wait_s: float | None = None) -> None:
        """The writer's end awaited, at most ``wait_s`` (default: the sink's own): then it is
        stopped, with a warning where the run completed (``wait_s`` None)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            code = proc.wait(timeout=self.wait_s if wait_s is None else wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            if wait_s is None:
                _warn(
                    f"the W&B writer did not end within {self.wait_s:g} s; it was stopped, and its files may be incomplete"
                )
            return
        if code != 0:
            _warn(f"the W&B writer failed ({_how(code)}); its files may be incomplete")
