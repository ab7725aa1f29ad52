"""SLURM: ranks started by srun (their variables translated for torch.distributed), and
sweeps on a cluster: one ``sbatch slurm/pp.sbatch`` job per point, then a comparison job
that starts when they have all ended (``--dependency=afterany``). The templates are the
checkout's slurm/ when ppx runs from a checkout (editable install), else the copies shipped
in the installed package (ppx/slurm)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ppx.errors import UserError
from ppx.paths import shipped, source_checkout


def template(name: str) -> Path:
    """The sbatch template ``name`` (pp.sbatch, compare.sbatch) that ppx ships (`shipped`)."""
    path = shipped("slurm") / name
    if not path.is_file():
        raise UserError(f"sbatch template {name} not found in {path.parent}")
    return path


def job_env(**values: str) -> dict:
    """A job's environment: ours, ``values``, and where the job finds ppx. The templates
    ``cd "$PPX_DIR"`` and run ``$PYTHON`` (default ``$PPX_DIR/.venv/bin/python``). From a
    checkout PPX_DIR defaults to it (and so PYTHON to its .venv, as for ``make sbatch``);
    from an installed package, to this directory (where sbatch is called from, so ./experiments
    and relative paths mean what they mean here) and PYTHON to this interpreter. PPX_DIR and
    PYTHON set in our environment are passed on as they are."""
    env = dict(os.environ, **values)
    if "PPX_DIR" not in env:
        repo = source_checkout()
        if repo is not None:
            env["PPX_DIR"] = str(repo)
        else:
            env["PPX_DIR"] = str(Path.cwd())
            env.setdefault("PYTHON", sys.executable)
    return env


def slurm_head_address(nodelist: str) -> str:
    """The first node of a SLURM node list, as its NodeAddr from ``scontrol show node``."""
    first = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    head = first.stdout.split()[0]
    shown = subprocess.run(["scontrol", "show", "node", head], capture_output=True, text=True, check=True)
    m = re.search(r"NodeAddr=(\S+)", shown.stdout)
    return m.group(1) if m else head


def _tasks_on_this_node(env) -> int:
    """This node's task count from SLURM_TASKS_PER_NODE (always set; '2(x3),1' = 2,2,2,1 by
    node), else SLURM_NTASKS_PER_NODE (set only with --ntasks-per-node), else 1."""
    counts = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = int(env.get("SLURM_NODEID", "0") or 0)
    if node < len(counts):
        return counts[node]
    return int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)


def adopt_srun_env(env=os.environ) -> None:
    """Translate srun's task variables into torch.distributed's env:// variables."""
    env.setdefault("RANK", env["SLURM_PROCID"])
    env.setdefault("WORLD_SIZE", env["SLURM_NTASKS"])
    env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    env.setdefault("LOCAL_WORLD_SIZE", str(_tasks_on_this_node(env)))
    if "MASTER_ADDR" not in env:
        env["MASTER_ADDR"] = slurm_head_address(env["SLURM_JOB_NODELIST"])
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))


def _sbatch(args: list[str], env: dict) -> str:
    try:
        out = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError("sbatch not found: --launcher slurm needs a SLURM cluster") from None
    if out.returncode != 0:
        raise UserError(
            f"sbatch failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        )
    return out.stdout.strip().split(";")[0]


def submit(
    experiment: str, grid: list[tuple[list[str], str]], overrides: list[str], root: Path, created: Path | None = None
) -> list[str]:
    """Submit every point (its overrides and run folder name), then the comparison; returns
    the job ids (comparison last). Extra sbatch options (``--nodes 2 --partition gpu``)
    come from ``PPX_SBATCH_ARGS``. Where nothing could be submitted, the sweep folder is
    removed, and ``created`` with it (the first of its parents the sweep made)."""
    extra = shlex.split(os.environ.get("PPX_SBATCH_ARGS", ""))
    root = root.resolve()
    made = (created or root).resolve()
    (root / "slurm").mkdir(exist_ok=True)
    ids = []
    for point, name in grid:
        env = job_env(EXP=experiment, ARGS=" ".join(overrides + point), RUN_DIR=str(root / name))
        try:
            job = _sbatch([*extra, f"--output={root / 'slurm'}/%j.out", str(template("pp.sbatch"))], env)
        except UserError:
            if not ids:  # nothing submitted: leave no sweep folder behind, nor the folders made for it
                shutil.rmtree(made)
            raise
        what = [*point, f"({name.rsplit(',', 1)[-1]})"] if "repeat=" in name else point  # (a repeated sweep's round)
        print(f"ppx sweep: submitted job {job}: {' '.join(what)}", flush=True)
        ids.append(job)
    last = _sbatch(
        [
            f"--dependency=afterany:{':'.join(ids)}",
            f"--output={root / 'slurm'}/compare-%j.out",
            str(template("compare.sbatch")),
        ],
        job_env(SWEEP_DIR=str(root)),
    )
    print(f"ppx sweep: comparison job {last} runs when they end; results in {root}", flush=True)
    return ids + [last]
