"""The command that measures a plan's best, the candidates predicted too close to tell from
it, 1F1B (the field's reference) and the run the plan read, beside one another: ``ppx sweep <the run's config> --repeat 5 'run.paired=[...]'``.
Each candidate is one ``run.paired`` entry (the ``pipeline.*``, ``model.*`` and ``train.*``
overrides of its own ``ppx run`` command), the run's own config is the floor, each job holds
every entry's steps against the floor's beside them, and ``ppx compare`` (which the sweep
runs) pools the jobs (docs/running.md). Only candidates an entry can be make it: the run's p
(its processes) and m (a step's work)."""

from __future__ import annotations

from ppx.errors import UserError

REPEAT = 5  # jobs: the pooled interval's t quantile is 2.78 at 5, 12.7 at 2
KEYS = ("pipeline.", "model.", "train.")  # what a run.paired entry may set


def entry_of(command: str) -> str:
    """A candidate's `ppx run` command as a ``run.paired`` entry: its overrides of the keys an
    entry sets, but the job's own (``pipeline.stages``) and m (an entry's is the run's)."""
    words = command.split()[3:]  # ppx run <experiment> ...
    skip = ("pipeline.stages=", "pipeline.microbatches=")
    return " ".join(w for w in words if w.startswith(KEYS) and not w.startswith(skip))


def paired_command(chosen: list[tuple[int, int, str]], run_cfg, experiment: str) -> str | None:
    """The sweep command measuring ``chosen`` ((p, m, its `ppx run` command) of the best, then
    of the candidates close to it, then 1F1B) and the run ``run_cfg`` of ``experiment`` (its config.yaml)
    beside one another, or None where that is one config (the best is the run's, alone) or the
    command would not run."""
    from ppx import config
    from ppx.config.paired import floors, variants
    from ppx.config.resolve import resolve_schedule

    p, m = resolve_schedule(run_cfg).num_ranks, run_cfg.pipeline.microbatches
    entries = list(dict.fromkeys(entry_of(c) for cp, cm, c in chosen if (cp, cm) == (p, m)))
    if not entries:
        return None
    try:
        cfg = config.load(experiment, [f"run.paired={_listed(entries)}", "run.dir=null"])
        if not floors(cfg):  # none of them is the run's own config: it joins them first, the floor
            entries.insert(0, f"pipeline.schedule={run_cfg.pipeline.schedule}")
            cfg = config.load(experiment, [f"run.paired={_listed(entries)}", "run.dir=null"])
        if len(entries) < 2:  # the best alone, and it is the run's own config: nothing to hold apart
            return None
        variants(cfg)
    except UserError:
        return None  # (two candidates of one config, a value an entry cannot hold)
    return f"ppx sweep {experiment} --repeat {REPEAT} 'run.paired={_listed(entries)}'"


def _listed(entries: list[str]) -> str:
    return "[" + ",".join(f'"{e}"' if " " in e else e for e in entries) + "]"
