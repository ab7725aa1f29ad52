"""The command that measures a plan's best, the candidates predicted too close to tell from
it, 1F1B (the field's reference) and the run the plan read, beside one another:
``ppx sweep <the run's config> --repeat 5 'run.paired=[...]'``. Each candidate is one
``run.paired`` entry (the ``pipeline.*``, ``model.*`` and ``train.*`` overrides that run it as
planned), the run's own config is the floor, each job holds every entry's steps against the
floor's beside them, and ``ppx compare`` (which the sweep runs) pools the jobs
(docs/running.md). A job's entries share its processes and its step's work, so only
candidates at the run's p and m can be entries; the others are named as left out."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from ppx.config.paired import SECTIONS
from ppx.errors import UserError

REPEAT = 5  # jobs: the pooled interval's t quantile is 2.78 at 5, 12.7 at 2
STEPS = 40  # a job's pairs at least: a short calibration run's steps would give too few to tell


@dataclass
class Measuring:
    """The measuring command ("" where no candidate can be an entry), the candidates (labels)
    it holds beside the run, those of them that are the run's own config (its floor, spelled
    otherwise), and the candidates left out: why -> labels."""

    command: str
    measured: list[str]
    own: list[str] = field(default_factory=list)
    left: dict[str, list[str]] = field(default_factory=dict)


def entry_of(overrides: list[str]) -> str | None:
    """A candidate's `ppx run` overrides as a ``run.paired`` entry: those of the keys an entry
    sets, but the job's own (``pipeline.stages``) and m (an entry's is the run's); None where a
    value holds a space (an entry splits at spaces)."""
    skip = ("pipeline.stages=", "pipeline.microbatches=")
    kept = [o for o in overrides if o.startswith(SECTIONS) and not o.startswith(skip)]
    return None if any(" " in o for o in kept) else " ".join(kept)


def paired_command(
    candidates: list[tuple[str, int, int, list[str]]],
    run_cfg,
    experiment: str,
    reference=(),
    more=(),
    least: int = 0,
) -> Measuring | None:
    """The sweep measuring ``candidates`` ((label, p, m, the overrides that run it) of the best
    first), then those of ``more`` (the next ranked, the same) at the run's p and m until
    ``least`` lists are measured, and ``reference`` (1F1B's, the same; those at the run's p and
    m only, the others not named as left out) beside the run ``run_cfg`` of ``experiment`` (its
    config.yaml), or None where there is nothing to hold apart (the run alone) or the command
    would not run. A candidate whose list is another's is one entry with it (run.paired
    refuses two of one config), named as left out."""
    from ppx import config
    from ppx.config.paired import floors
    from ppx.config.resolve import resolve_schedule

    p, m = resolve_schedule(run_cfg).num_ranks, run_cfg.pipeline.microbatches
    entries: dict[str, str] = {}  # entry -> the first candidate's label
    loaded: dict[str, object] = {}  # entry -> its config, each loaded once (`_twin`)
    left: dict[str, list[str]] = {}
    reference = [c for c in reference if (c[1], c[2]) == (p, m)]
    for label, cp, cm, overrides in candidates:
        entry = entry_of(overrides)
        if (cp, cm) != (p, m):
            left.setdefault(f"another p or m than the run's p={p} m={m}", []).append(label)
        elif entry is None:
            left.setdefault("a value with a space", []).append(label)
        else:
            twin = _add(run_cfg, entry, label, entries, loaded)
            if twin is not None and label != twin:  # (zb_auto's list is often 1F1B's: one entry, not a refused pair)
                left.setdefault(f"the same list as {twin}", []).append(label)
    for label, cp, cm, overrides in more:  # (not promised: a twin, or a value with a space, passed over)
        if len(entries) >= least:
            break
        entry = entry_of(overrides)
        if (cp, cm) == (p, m) and entry is not None:
            _add(run_cfg, entry, label, entries, loaded)
    for label, _, _, overrides in reference:
        entry = entry_of(overrides)
        if entry is not None:
            _add(run_cfg, entry, label, entries, loaded)
    if not entries:  # nothing a job of the run's shape can hold: say what is left out
        return Measuring("", [], [], left) if left else None
    base = [] if run_cfg.train.steps >= STEPS else [f"train.steps={STEPS}"]
    listed = list(entries)
    try:
        cfg = config.load(experiment, [f"run.paired={paired_value(listed)}", "run.dir=null", *base])
        own = floors(cfg)
        if not own:  # none of them is the run's own config: it joins them first, the floor
            listed.insert(0, _floor(run_cfg))
            config.load(
                experiment, [f"run.paired={paired_value(listed)}", "run.dir=null", *base]
            )  # checked again with it
    except UserError:  # (config.load checks every entry: two candidates of one config, a value an entry cannot hold)
        return None
    if len(listed) < 2:  # the run alone: nothing to hold apart
        return None
    where = shlex.quote(experiment)
    command = " ".join(["ppx sweep", where, "--repeat", str(REPEAT), f"'run.paired={paired_value(listed)}'", *base])
    return Measuring(command, list(entries.values()), [label for e, label in entries.items() if e in own], left)


def _add(run_cfg, entry: str, label: str, entries: dict[str, str], loaded: dict) -> str | None:
    """Adds ``entry`` (of candidate ``label``) to ``entries`` unless one there runs the same; the
    label of that one, or None where it was added. ``loaded``: the entries' configs so far."""
    if entry in entries:
        return entries[entry]
    twin = _twin(run_cfg, entry, entries, loaded)
    if twin is not None:
        return entries[twin]
    entries[entry] = label
    return None


def _twin(run_cfg, entry: str, entries: dict[str, str], loaded: dict) -> str | None:
    """The entry among ``entries`` that runs what ``entry`` runs (`same_run`: run.paired refuses
    two of one config), or None; None too where either cannot be read here (config.load says).
    Each entry's config is loaded once into ``loaded``."""
    from omegaconf.errors import OmegaConfBaseException

    from ppx.config.paired import entry_config, same_run

    def config_of(e: str):
        if e not in loaded:
            loaded[e] = entry_config(run_cfg, e)
        return loaded[e]

    try:
        mine = config_of(entry)
        return next((e for e in entries if same_run(mine, config_of(e))), None)
    except (UserError, OmegaConfBaseException, OSError, ValueError):
        return None


def _floor(run_cfg) -> str:
    """The run's own config as an entry, its schedule as the run names it (and its split
    backward where the run set one: a drain run's floor says so)."""
    way = run_cfg.train.split_backward
    return f"pipeline.schedule={run_cfg.pipeline.schedule}" + (f" train.split_backward={way}" if way != "auto" else "")


def note(measuring: Measuring) -> str:
    """What the plan's note says: what the command measures, and what it leaves out (a job's
    entries share its p and m: the others compare as whole runs, repeated)."""
    left = "; ".join(f"{', '.join(labels)} ({why})" for why, labels in measuring.left.items())
    if not measuring.command:
        return (
            f"{left}: a job's entries share its p and m, so these compare as whole runs, repeated (ppx sweep "
            "--repeat), and ppx compare"
        )
    what = ", ".join(f"{x} (the run's own config)" if x in measuring.own else x for x in measuring.measured)
    out = f"{what} beside the run's own config, step by step, jobs pooled: {measuring.command}"
    return out + (f"; left out: {left}" if left else "")


def paired_value(entries: list[str]) -> str:
    """``run.paired``'s value for ``entries``, as a shell's single quotes pass it (an entry with a
    space in double quotes)."""
    return "[" + ",".join(f'"{e}"' if " " in e else e for e in entries) + "]"
