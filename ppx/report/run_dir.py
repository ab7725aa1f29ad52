"""The files of a run directory (written whole: `ppx.files`), read back typed
(`RunDir`: summary.json as a `Summary`, config.yaml as a `Config`, env.json, metrics.jsonl)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ppx.errors import UserError, first_line


@dataclass(frozen=True)
class RankSummary:
    """One rank's row of summary.json (medians over steps; peaks are maxima); a field is None
    where the run did not measure it."""

    rank: int
    compute_s: float | None = None
    comm_s: float | None = None
    dp_comm_s: float | None = None
    idle_s: float | None = None
    bubble_fraction: float | None = None
    peak_inflight_microbatches: int | None = None
    peak_activation_bytes: int | None = None
    peak_memory_bytes: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> RankSummary:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


_REQUIRED = ("schedule", "world_size", "microbatches", "step_time_s")


@dataclass(frozen=True)
class Summary:
    """What `ppx compare`, `ppx simulate --from-run` and the bench read of summary.json, parsed
    once; values are as the JSON holds them, None where a run's summary has no such field
    (no timers: no bubble; no timeline: no prediction)."""

    schedule: str
    world_size: int
    microbatches: int
    step_time_s: float
    status: str | None = None
    experiment: str | None = None
    stages: int | None = None
    virtual_stages: int | None = None
    model: str | None = None
    batch_size: int | None = None
    throughput_samples_per_s: float | None = None
    bubble_fraction: float | None = None
    bubble_fraction_theory: float | None = None
    losses: tuple = ()
    step_times_s: tuple = ()  # every step's, in order
    ranks: tuple[RankSummary, ...] = ()
    measured_costs: dict | None = None  # as `ppx.measure.prediction.mean_costs` gives them
    cost_samples: dict | None = None  # every sample the means come from (`ppx.measure.prediction.cost_samples`)
    measured_step_time_s: float | None = None  # over the timeline's steps, where the costs come from
    measured_bubble_fraction: float | None = None
    predicted_bubble_fraction: float | None = None
    prediction_error_bubble_fraction: float | None = None  # measured minus predicted

    @classmethod
    def from_dict(cls, s: dict, where: str = "summary.json") -> Summary:
        missing = [k for k in _REQUIRED if s.get(k) is None]
        if missing:
            raise UserError(f"{where} has no {', '.join(missing)} (not a ppx run's summary?)")
        derived = ("losses", "step_times_s", "ranks", "predicted_bubble_fraction", "prediction_error_bubble_fraction")
        plain = {k: s[k] for k in cls.__dataclass_fields__ if k not in derived and k in s}
        return cls(
            **plain,
            losses=tuple(s.get("losses") or ()),
            step_times_s=tuple(s.get("step_times_s") or ()),
            ranks=tuple(RankSummary.from_dict(r) for r in s.get("ranks") or ()),
            predicted_bubble_fraction=(s.get("predicted") or {}).get("bubble_fraction"),
            prediction_error_bubble_fraction=(s.get("prediction_error") or {}).get("bubble_fraction"),
        )

    @property
    def virtual(self) -> int:
        """Stages per rank (1 unless interleaved): the stages over the ranks where both are
        known (a CSV run's summary from before it recorded its own said 1)."""
        if self.stages and self.world_size and self.stages % self.world_size == 0:
            return self.stages // self.world_size
        return self.virtual_stages or 1

    @property
    def throughput(self) -> float | None:
        """Samples per second (from the step time where the summary predates the field)."""
        if self.throughput_samples_per_s:
            return self.throughput_samples_per_s
        return self.batch_size / self.step_time_s if self.batch_size else None

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1] if self.losses else None

    @property
    def peak_activation_bytes(self) -> int | None:
        """The busiest rank's peak of saved activations (None when not measured; 0 is a
        measurement: a forward-only run saves nothing)."""
        return _peak(r.peak_activation_bytes for r in self.ranks)

    @property
    def peak_memory_bytes(self) -> int | None:
        """The highest rank's peak memory (None when not measured)."""
        return _peak(r.peak_memory_bytes for r in self.ranks)

    @property
    def step_time_of_costs_s(self) -> float:
        """The measured step over the steps the costs come from (the run's own step when the
        summary predates the field)."""
        return self.step_time_s if self.measured_step_time_s is None else self.measured_step_time_s

    @property
    def bubble_of_costs(self) -> float | None:
        """The measured bubble over the steps the costs come from, else the run's median."""
        return self.bubble_fraction if self.measured_bubble_fraction is None else self.measured_bubble_fraction


RUN_FILES = ("summary.json", "env.json", "metrics.jsonl", "incomplete.txt")  # one of them beside config.yaml


def completed(folder: Path) -> bool:
    """Whether ``folder`` holds a run that completed: its summary.json, and no incomplete.txt."""
    return (folder / "summary.json").exists() and not (folder / "incomplete.txt").exists()


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is a run's, completed or not: its config.yaml beside a file only a
    run writes (a project's own config.yaml is no run). A run whose every process was killed
    at once (SIGKILL, an OOM killer) has no incomplete.txt, and is one still."""
    return (folder / "config.yaml").exists() and any((folder / f).exists() for f in RUN_FILES)


def run_holding(path: str | Path) -> Path | None:
    """The run folder that ``path`` is or lies in (the nearest), or None: where ppx never
    writes (a run's files are the run's alone). A run's folder holds its config.yaml and its
    status/ folder from its start (a project's folder with a config.yaml beside a
    metrics.jsonl of its own is none)."""
    # (.. resolved: ../elsewhere from inside a run is not in it; then where links lead, a file of a
    # run's linked from elsewhere included)
    for p in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
        found = next((q for q in [p, *p.parents] if (q / "config.yaml").is_file() and (q / "status").is_dir()), None)
        if found is not None:
            return found
    return None


class RunDir:
    """A run directory read back: each file is read once, when first asked for; a missing or
    unreadable file is a one-line `UserError`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._name = str(path)  # as given, for messages
        if not self.path.is_dir():
            what = "a file" if self.path.exists() else "no such folder"
            raise UserError(f"{self._name} is not a run directory ({what})")

    def __repr__(self) -> str:
        return f"RunDir({self._name!r})"

    @property
    def is_complete(self) -> bool:
        """Whether the run finished: rank 0 wrote summary.json, and nothing wrote incomplete.txt
        (a job that failed after the summary: in its report, its last barrier)."""
        return completed(self.path)

    def _text(self, name: str, why: str = "") -> str:
        try:
            return (self.path / name).read_text()
        except FileNotFoundError:
            raise UserError(f"{self._name} has no {name}{why}") from None
        except UnicodeDecodeError as e:
            raise UserError(f"{self._name}/{name} is not text ({e.reason} at byte {e.start})") from None

    @cached_property
    def raw_summary(self) -> dict[str, Any]:
        """summary.json as written."""
        if not (self.path / "summary.json").exists() and not is_run_folder(self.path):
            runs = next(self.path.rglob("summary.json"), None) is not None
            raise UserError(
                f"{self._name} is not a run directory (no config.yaml beside a run's files)"
                + ("; it holds runs: name one of them" if runs else "")
            )
        text = self._text("summary.json", " (the run did not complete)")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{self._name}/summary.json is not JSON ({e})") from None
        if not isinstance(data, dict):
            raise UserError(f"{self._name}/summary.json is not a run summary (a JSON object)")
        return data

    @cached_property
    def summary(self) -> Summary:
        return Summary.from_dict(self.raw_summary, f"{self._name}/summary.json")

    @cached_property
    def config(self):
        """config.yaml, the resolved config the run ran with (`ppx.config.Config`)."""
        import yaml
        from omegaconf.errors import OmegaConfBaseException

        from ppx import config

        if not self._text("config.yaml").strip():
            raise UserError(f"{self._name}/config.yaml is empty")
        try:
            return config.from_yaml(self.path / "config.yaml")
        except (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError) as e:  # another ppx's keys
            raise UserError(
                f"{self._name}/config.yaml: this ppx cannot read it ({first_line(e) or type(e).__name__})"
            ) from None

    @cached_property
    def env(self) -> dict | None:
        """env.json (backend, versions, hosts), or None when the run has none."""
        path = self.path / "env.json"
        return json.loads(path.read_text()) if path.exists() else None

    @cached_property
    def metrics(self) -> list[dict]:
        """metrics.jsonl: one dict per step, in step order."""
        return [json.loads(line) for line in self._text("metrics.jsonl").splitlines() if line.strip()]


def _peak(values) -> int | None:
    """The largest of the ranks' values that were measured, or None."""
    got = [v for v in values if v is not None]
    return max(got) if got else None
