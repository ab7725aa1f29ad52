"""The config: one schema (`schema`), its loading (`loading`), its rules (`rules`) and what
the pipeline section resolves to (`resolve`)."""

from ppx.config.loading import SUMMARY_ONLY, as_overrides, experiments_dirs, find_experiment, from_yaml, load, to_yaml
from ppx.config.resolve import resolve_schedule, virtual_stages
from ppx.config.rules import check
from ppx.config.schema import Config, describe

__all__ = [
    "SUMMARY_ONLY",
    "Config",
    "as_overrides",
    "check",
    "describe",
    "experiments_dirs",
    "find_experiment",
    "from_yaml",
    "load",
    "resolve_schedule",
    "to_yaml",
    "virtual_stages",
]
