"""Weights & Biases logging from rank 0: offline by default (no account needed; files land in
``<run>/wandb/`` and ``wandb sync`` uploads them later). Logging never kills training: any
W&B failure is reported once and logging goes on offline, or stops."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ppx.errors import said
from ppx.report.scalars import run_scalars


def _warn(msg: str) -> None:
    print(f"ppx: warning: {msg}", file=sys.stderr, flush=True)


class WandbSink:
    def __init__(self, cfg, run_dir: Path, config_dict: dict):
        self.run = None
        self.run_dir = run_dir
        self.last_step: int | None = None  # the run's last step: the pictures and report log there
        w = cfg.logging.wandb
        # ppx prints its own W&B line; Settings(silent=True) leaves artifact uploads chatty
        os.environ.setdefault("WANDB_SILENT", "true")
        # W&B logs to its own <run>/wandb/.../debug.log (a FileHandler): one that cannot be written
        # (a full disk, a file-size limit) printed Python's "--- Logging error ---" traceback for
        # each of its lines; the write failure is ppx's own files' too, said there in one line
        logging.raiseExceptions = False
        try:
            import wandb
        except Exception as e:  # pragma: no cover - wandb is a dependency
            _warn(f"W&B unavailable ({e}); not logging to W&B")
            return
        self.wandb = wandb
        kwargs = dict(
            project=w.project,
            entity=w.entity,
            group=w.group or cfg.run.name,
            tags=list(w.tags),
            name=f"{cfg.run.name}/{run_dir.name}",
            dir=str(run_dir),
            config=config_dict,
            settings=wandb.Settings(silent=True, console="off"),
        )
        try:
            self.run = wandb.init(mode=w.mode, **kwargs)
        except Exception as e:
            first = said(e)
            if w.mode == "online":
                _warn(f"W&B online failed ({first}); logging offline instead")
                try:
                    self.run = wandb.init(mode="offline", **kwargs)
                except Exception as e2:
                    _warn(f"W&B offline failed too ({said(e2)}); not logging to W&B")
            else:
                _warn(f"W&B failed ({first}); not logging to W&B")

    def _guard(self, what: str, fn) -> None:
        if self.run is None:
            return
        try:
            fn()
        except Exception as e:
            _warn(f"W&B {what} failed ({said(e)}); not logging to W&B any more")
            self.run = None

    def step(self, step: int, scalars: dict[str, float]) -> None:
        self.last_step = step
        self._guard("log", lambda: self.run.log(scalars, step=step))

    def finish(self, summary: dict, run_dir: Path) -> None:
        wandb = self.wandb if self.run is not None else None
        at = {} if self.last_step is None else {"step": self.last_step}  # not a step after the run's last

        def final():
            keys = (
                "step_time_s",
                "bubble_fraction",
                "bubble_over_ideal",
                "bubble_fraction_theory",
                "bubble_over_ideal_theory",
                "ideal_step_time_s",
                "step_time_over_ideal",
                "status",
            )
            self.run.summary.update({k: summary[k] for k in keys if summary.get(k) is not None})
            ranks = summary.get("ranks", [])
            if ranks:
                cols = sorted({k for r in ranks for k in r}, key=lambda k: (k != "rank", k))
                self.run.log({"ranks": wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in ranks])}, **at)
            pictures = {k: run_dir / f"{k}.png" for k in ("timeline", "breakdown")}
            pictures = {k: wandb.Image(str(p)) for k, p in pictures.items() if p.exists()}
            if pictures:
                self.run.log(pictures, **at)
            page = run_dir / "report.html"
            if page.exists():  # the file as it is (inject=False: no W&B stylesheet link added)
                self.run.log({"report": wandb.Html(str(page), inject=False)}, **at)
            traces = sorted((run_dir / "tb").glob("*.pt.trace.json"))  # profile.enabled: torch.profiler's
            extra = [p for p in (run_dir / "timeline.json",) if p.exists()]
            if extra or traces:
                art = wandb.Artifact(f"traces-{self.run.id}", type="profiler-traces")
                for p in traces:
                    art.add_file(str(p.resolve()), name=f"traces/{p.name}", policy="immutable")
                for p in extra:
                    art.add_file(str(p.resolve()), policy="immutable")
                self.run.log_artifact(art)
            # the runs table shows a run's summary: its step scalars there are the run's own
            # (medians, `run_scalars`), not the last step's, W&B's default, which a run that did
            # not complete keeps; set once the last step's row is committed, which sets the default
            self.run.log({}, **at, commit=True)
            self.run.summary.update(run_scalars(summary))
            mode = self.run.settings.mode
            self.run.finish()
            if mode == "offline":
                offline = next(iter(sorted((run_dir / "wandb").glob("offline-run-*"))), None)
                if offline is not None:
                    print(f"ppx: W&B offline run: {offline} (upload: wandb sync {offline})", flush=True)

        self._guard("finish", final)
