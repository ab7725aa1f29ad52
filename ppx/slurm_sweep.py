"""Sweeps on a cluster: one ``sbatch slurm/pp.sbatch`` job per point, then a comparison job
that starts when they have all ended (``--dependency=afterany``)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ppx.errors import UserError

REPO = Path(__file__).resolve().parent.parent


def _sbatch(args: list[str], env: dict) -> str:
    try:
        out = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError("sbatch not found: --launcher slurm needs a SLURM cluster") from None
    if out.returncode != 0:
        raise UserError(f"sbatch failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return out.stdout.strip().split(";")[0]


def submit(experiment: str, grid: list[list[str]], overrides: list[str], root: Path) -> list[str]:
    """Submit every point, then the comparison; returns the job ids (comparison last).
    Extra sbatch options (``--nodes 2 --partition gpu``) come from ``PPX_SBATCH_ARGS``."""
    from ppx.sweep import point_name

    extra = shlex.split(os.environ.get("PPX_SBATCH_ARGS", ""))
    root = root.resolve()
    (root / "slurm").mkdir(exist_ok=True)
    ids = []
    for point in grid:
        env = dict(os.environ, EXP=experiment, ARGS=" ".join(overrides + point),
                   RUN_DIR=str(root / point_name(point)), PPX_DIR=os.environ.get("PPX_DIR", str(REPO)))
        try:
            job = _sbatch([*extra, f"--output={root / 'slurm'}/%j.out", str(REPO / "slurm" / "pp.sbatch")], env)
        except UserError:
            if not ids:  # nothing submitted: leave no sweep folder behind
                shutil.rmtree(root)
            raise
        print(f"ppx sweep: submitted job {job}: {' '.join(point)}", flush=True)
        ids.append(job)
    env = dict(os.environ, SWEEP_DIR=str(root), PPX_DIR=os.environ.get("PPX_DIR", str(REPO)))
    last = _sbatch([f"--dependency=afterany:{':'.join(ids)}", f"--output={root / 'slurm'}/compare-%j.out",
                    str(REPO / "slurm" / "compare.sbatch")], env)
    print(f"ppx sweep: comparison job {last} runs when they end; results in {root}", flush=True)
    return ids + [last]
