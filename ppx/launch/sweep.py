"""`ppx sweep`: run the product of some config values, then compare the runs.

``pipeline.schedule=naive,gpipe,1f1b pipeline.microbatches=1,2,4,8,16`` is 15 runs, each a
normal ``ppx run`` into ``<run.root>/<experiment>/sweep-<stamp>/<point>/``. A sweep across
schedules on the known-cost model compares them at equal work (`equal_work`).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ppx import config
from ppx.errors import UserError
from ppx.launch.claim import check_free, new_folder
from ppx.launch.stops import stops_handled


class SweepStopped(Exception):
    """A stop signal (`ppx.launch.stops`) ended the sweep: the point running then was
    ended by its own ``ppx run`` (its run directory says so), and no later point ran."""

    def __init__(self, signum: int, root: Path, point: int, points: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.root, self.point, self.points = signum, root, point, points


def _run_forwarding(cmd: list[str]) -> tuple[int, int | None]:
    """Run one point's ``ppx run``; a stop signal to the sweep goes on to it, whose supervisor
    ends its job and marks the run incomplete, and the sweep's death (kill -9) is a SIGTERM to
    it. (its exit code, the signal received or None)."""
    got: list[int] = []
    proc = subprocess.Popen(cmd, env=dict(os.environ, PPX_SWEEP_PID=str(os.getpid())))  # (`follow_parent`)

    def forward(signum, frame):
        got.append(signum)
        proc.send_signal(signum)

    with stops_handled(forward):
        code = proc.wait()
    return code, (got[0] if got else None)


def _split_values(values: str) -> list[str]:
    """Split on commas outside brackets: '[3,1],[2,2]' -> ['[3,1]', '[2,2]']."""
    out, depth, cur = [], 0, ""
    for ch in values:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def parse_spec(spec: str) -> list[tuple[str, list[str]]]:
    """'a=1,2 b=x,y' -> [('a', ['1', '2']), ('b', ['x', 'y'])]; list values in brackets
    ('pipeline.layers_per_stage=[3,1],[2,2]')."""
    axes = []
    for part in spec.split():
        key, eq, values = part.partition("=")
        if not eq or not key or not values:
            raise UserError(f"sweep item {part!r} must look like key=v1,v2,...")
        if key in (k for k, _ in axes):
            raise UserError(f"sweep key {key} is given twice; list all its values once: {key}=v1,v2,...")
        split = _split_values(values)
        if "" in split:  # ('pipeline.microbatches=,4': a typo, not a point fewer)
            raise UserError(f"sweep item {part!r} has an empty value; list them as {key}=v1,v2,...")
        axes.append((key, split))
    if not axes:
        raise UserError("the sweep is empty; give e.g. pipeline.schedule=gpipe,1f1b")
    return axes


def points(axes) -> list[list[str]]:
    return [[f"{k}={v}" for (k, _), v in zip(axes, combo)] for combo in itertools.product(*(vs for _, vs in axes))]


def point_name(overrides: list[str], whole_paths: bool = False) -> str:
    """'pipeline.schedule=gpipe' -> 'schedule=gpipe': the key's last part and the value; a
    path's last part ('pipeline.schedule=/tmp/x/my.csv' -> 'schedule=my.csv'), or with
    ``whole_paths`` the whole path, its slashes as underscores."""
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        value = value.replace("/", "_") if whole_paths else value.rstrip("/").rsplit("/", 1)[-1]
        out.append(f"{key.split('.')[-1]}={value}")
    return ",".join(out)


def point_names(grid: list[list[str]]) -> list[str]:
    """Each point's run folder name (`point_name`), paths by their last part unless two points
    would then share a name (two ``my.csv`` in two folders): then by their whole paths."""
    names = [point_name(p) for p in grid]
    return names if len(set(names)) == len(names) else [point_name(p, whole_paths=True) for p in grid]


def in_rounds(grid: list[list[str]], names: list[str], repeat: int) -> list[tuple[list[str], str, int]]:
    """(a point's overrides, its run folder's name, its round) in the order a sweep runs them:
    every point once, then every point again, ``repeat`` rounds (a slow spell of the machine
    falls on every point alike); a repeated point's folder says its round (``<point>,repeat=<r>``,
    or ``repeat=<r>`` for the one config of a sweep without --sweep)."""
    if repeat == 1:
        return [(point, name, 1) for point, name in zip(grid, names)]
    return [
        (point, f"{name},repeat={r}" if name else f"repeat={r}", r)
        for r in range(1, repeat + 1)
        for point, name in zip(grid, names)
    ]


# sweeping these compares placements: on the known-cost model, at equal work only per layer
PLACEMENT_KEYS = ("pipeline.schedule", "pipeline.virtual_stages")


def _sets_in_experiment(experiment: str, key: str) -> bool:
    """Whether the experiment YAML itself sets ``key`` (a dotted key)."""
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.load(config.find_experiment(experiment))
    except Exception:  # config.load reports a bad experiment in one line
        return False
    return OmegaConf.select(loaded, key, default=None) is not None if OmegaConf.is_dict(loaded) else False


def equal_work(experiment: str, axes, overrides: list[str]) -> str | None:
    """The override that makes a sweep across schedules compare them at equal work, or None:
    a sweep over `PLACEMENT_KEYS` charges the known-cost model's costs per layer
    (``model.cost_per=layer``; per stage, v stages per rank would do v times 1F1B's work)
    unless the experiment or the command line sets ``model.cost_per``."""
    keys = [k for k, _ in axes] + [o.split("=", 1)[0].strip() for o in overrides]
    if not any(k in PLACEMENT_KEYS for k, _ in axes) or "model.cost_per" in keys:
        return None
    return None if _sets_in_experiment(experiment, "model.cost_per") else "model.cost_per=layer"


def _load(experiment: str, overrides: list[str]):
    """The config of ``overrides`` on the experiment, or its error's message."""
    try:
        return config.load(experiment, overrides)
    except UserError as e:
        return str(e)


def _load_points(experiment: str, overrides: list[str], grid: list[list[str]]) -> list:
    """Every point's config, checked before any runs. An error the swept values do not cause
    (an unknown experiment, a fixed override's: every point and the fixed overrides alone give
    it alike) is said as it is; one they cause names the first point that gives it."""
    loaded = [_load(experiment, overrides + point) for point in grid]
    wrong = [(point, said) for point, said in zip(grid, loaded) if isinstance(said, str)]
    if not wrong:
        return loaded
    point, said = wrong[0]
    if len(wrong) == len(grid) and {s for _, s in wrong} == {said} and _load(experiment, overrides) == said:
        raise UserError(said)
    raise UserError(f"sweep point {' '.join(point)}: {said}")


def run_sweep(
    experiment: str, spec: str | None, overrides: list[str], launcher: str = "local", repeat: int = 1
) -> tuple[Path, list[str]]:
    """Run every point of ``spec``'s grid (none: the one config) ``repeat`` times, in rounds
    (each point once, then again: repeats alternated, as timings on a shared machine need),
    each into its own run folder under one sweep folder: (that folder, the points that failed,
    a folder of their own or not)."""
    if repeat < 1:
        raise UserError(f"--repeat {repeat}: give 1 or more runs of each point")
    axes = parse_spec(spec) if spec else []
    if not axes and repeat < 2:
        raise UserError('give --sweep "key=v1,v2 ...", or --repeat N to run one config N times')
    # (run.dir=null, no folder of its own, as a plan's printed commands end: what a sweep does)
    given = [(k.strip(), v.strip()) for k, _, v in (o.partition("=") for o in overrides)]
    fixed = [k for k, v in given if not (k == "run.dir" and v in ("null", "~"))]
    if "run.dir" in [k for k, _ in axes] + fixed:
        raise UserError("run.dir names one run; a sweep writes its runs under <run.root>/<run.name>/sweep-<time>/")
    both = next((k for k, _ in axes if k in fixed), None)
    if both is not None:  # the swept values would win, the fixed one silently lost
        raise UserError(f"{both} is swept and also given as an override; give it in --sweep only")
    grid = points(axes)
    names = point_names(grid)
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise UserError(f"two sweep points would share the run folder {twice!r}; give each value once")
    extra = equal_work(experiment, axes, overrides)
    if extra is not None:
        # only where it means something: a point on the known-cost model
        kinds = {cfg.model.kind for cfg in _load_points(experiment, [*overrides, extra], grid)}
        extra = extra if "synthetic" in kinds else None
    if extra is not None:
        overrides = [*overrides, extra]
    cfgs = _load_points(experiment, overrides, grid)  # every point validated before any runs
    if extra is not None:
        varied = " and ".join(k for k, _ in axes if k in PLACEMENT_KEYS)
        print(
            f"ppx sweep: {extra}: the points vary {varied}, so the known-cost model's model.fwd_ms/bwd_ms/wgrad_ms "
            "are per layer and every point does the same work (model.layers x the costs); "
            "set model.cost_per=stage to charge them per stage",
            flush=True,
        )
    check_free(cfgs[0], one_run=False)  # run.root a file, or under one: its one line
    parent = Path(cfgs[0].run.root) / cfgs[0].run.name
    made = next((d for d in [*reversed(parent.parents), parent] if not d.exists()), None)
    parent.mkdir(parents=True, exist_ok=True)
    root = new_folder(parent, f"sweep-{time.strftime('%Y%m%d-%H%M%S')}")  # (another begun this second: -1)
    created = made or root  # the first folder made here
    grid, names, rounds = map(list, zip(*in_rounds(grid, names, repeat)))
    print(f"ppx sweep: {len(grid)} runs into {root}", flush=True)
    if launcher == "slurm":
        from ppx.launch.slurm import submit

        submit(experiment, list(zip(grid, names)), overrides, root, created)
        return root, []
    failed = []
    for k, point in enumerate(grid, 1):
        what = (" ".join(point) + (f" (round {rounds[k - 1]} of {repeat})" if repeat > 1 else "")).strip()
        print(f"ppx sweep: [{k}/{len(grid)}] {what}", flush=True)
        cmd = [
            sys.executable,
            "-m",
            "ppx.cli",
            "run",
            experiment,
            *overrides,
            *point,
            f"run.dir={root / names[k - 1]}",
        ]
        code, stopped = _run_forwarding(cmd)
        if stopped is not None:
            raise SweepStopped(stopped, root, k, len(grid))
        if code != 0:
            failed.append(what)
    if failed:
        print(f"ppx sweep: {len(failed)} run(s) failed: {'; '.join(failed)}", file=sys.stderr)
    return root, failed
