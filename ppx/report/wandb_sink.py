"""Weights & Biases logging from rank 0: offline by default (no account needed; files land in
``<run>/wandb/`` and ``wandb sync`` uploads them later). All W&B work is the W&B writer's
(`ppx.report.wandb_writer`), a process this sink starts and feeds: rank 0 never imports W&B.
An offline run's writer starts once its steps are over (its steps' scalars kept until then); an
online one with the run, so that its charts are live. Logging never kills training:
any W&B failure is reported once and logging goes on offline, or stops."""

from __future__ import annotations

import json
import os
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


def _warn(msg: str) -> None:
    print(f"ppx: warning: {msg}", file=sys.stderr, flush=True)


class WandbSink:
    def __init__(self, cfg, run_dir: Path, config_dict: dict, cpus: list | None = None):
        """``cpus``: the CPUs the writer runs on (the job's: rank 0 is pinned to its own)."""
        w = cfg.logging.wandb
        self.wait_s = max(cfg.runtime.timeout_s, 60.0)  # for the writer's end (its files, an upload)
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
        self.cpus, self.proc, self.started = cpus, None, False
        self.kept = [{"init": init}]  # offline: the messages for a writer started once the steps are over
        if w.mode == "online":  # (live: the writer, and W&B, start with the run)
            self._start_writer()

    def _start_writer(self) -> None:
        """The writer started on the job's CPUs and sent what was kept."""
        self.started = True
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "ppx.report.wandb_writer"], stdin=subprocess.PIPE)
        except OSError as e:
            _warn(f"the W&B writer did not start ({e}); not logging to W&B")
            return
        if self.cpus:
            try:
                os.sched_setaffinity(self.proc.pid, self.cpus)
            except OSError:  # (it ended at once, or the CPUs changed: it keeps rank 0's)
                pass
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
        except (OSError, ValueError):  # the writer ended (it said why): nothing more to send
            self.proc = None

    def step(self, step: int, scalars: dict[str, float]) -> None:
        self._send({"step": step, "scalars": scalars})

    def start(self) -> None:
        """The run's steps are over: an offline run's writer starts now (a new process beside a
        timed step would take its CPU), and W&B with it, while the report draws."""
        if not self.started:
            self._start_writer()
        self._send({"start": True})

    def finish(self, summary: dict, run_dir: Path) -> None:
        """The run's summary to the writer, which logs it with the run's files; its end awaited."""
        end = {
            "run_dir": str(run_dir),
            "summary": {k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None},
            "ranks": summary.get("ranks", []),
            "run_scalars": run_scalars(summary),
        }
        if not self.started:
            self.start()
        self._send({"finish": end})
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=self.wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            _warn(
                f"the W&B writer did not end within {self.wait_s:g} s; it was stopped, and its files may be incomplete"
            )
