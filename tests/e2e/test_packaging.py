"""A plain (non-editable) install ships what ppx needs besides its modules: the experiment
YAMLs (experiments/ -> ppx/experiments) and the sbatch templates (slurm/ -> ppx/slurm).

The checkout is copied (so the build leaves nothing in it), installed from the copy with
``pip install --no-deps --target`` (a real wheel built and installed, no link back to the
source), and run from another directory with this interpreter's packages (torch and the
rest) and PYTHONPATH at the install, which comes before the checkout's editable install.
Self-contained on purpose: subprocesses and tmp_path, nothing from conftest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.plain_agent  # how a job starts and ends, as a user's does (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
# the tree pip builds from: what is not part of the source stays behind
LEAVE_OUT = shutil.ignore_patterns(
    ".git",
    ".venv",
    "venv",
    "runs",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    "wandb",
    "tests",
    "docs",
    "bench",
)


def _has_setuptools() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 64


def _source(tmp: Path) -> Path:
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=LEAVE_OUT)
    return src


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """ppx installed from a copy of the checkout into a fresh folder (its site)."""
    tmp = tmp_path_factory.mktemp("packaging")
    site = tmp / "site"
    # without setuptools here (a Python 3.12+ venv has none) pip fetches it into an isolated build env
    isolation = ["--no-build-isolation"] if _has_setuptools() else []
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-input",
            "--disable-pip-version-check",
            *isolation,
            "--target",
            str(site),
            str(_source(tmp)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return site


def _env(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PPX_DIR", "PYTHON", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site), PYTHONNOUSERSITE="1", WANDB_MODE="disabled")
    return env


def test_every_module_and_data_file_is_installed(installed):
    package = installed / "ppx"
    missing = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "ppx").rglob("*.py")
        if "__pycache__" not in p.parts and not (package / p.relative_to(REPO / "ppx")).is_file()
    )
    assert not missing, f"not in the wheel (add their packages to [tool.setuptools] packages): {missing}"
    for folder, pattern in (("experiments", "*.yaml"), ("slurm", "*.sbatch")):
        shipped = sorted(p.name for p in (package / folder).glob(pattern))
        assert shipped == sorted(p.name for p in (REPO / folder).glob(pattern)), folder
    assert (installed / "bin" / "ppx").is_file()


def test_installed_package_finds_its_experiments_and_templates(installed, tmp_path):
    probe = (
        "import json, sys, ppx\n"
        "from ppx.config import experiments_dirs, find_experiment\n"
        "from ppx.launch.slurm import job_env, template\n"
        "from ppx.paths import source_checkout as checkout\n"
        "env = job_env()\n"
        "print(json.dumps({'ppx': ppx.__file__, 'dirs': [str(d) for d in experiments_dirs()],\n"
        "    'experiment': str(find_experiment('gpipe_4gpu')), 'pp': str(template('pp.sbatch')),\n"
        "    'compare': str(template('compare.sbatch')), 'checkout': checkout() and str(checkout()),\n"
        "    'PPX_DIR': env['PPX_DIR'], 'PYTHON': env.get('PYTHON'), 'python': sys.executable}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=_env(installed), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    package = (installed / "ppx").resolve()
    assert Path(got["ppx"]).resolve().parent == package, "the checkout's ppx was imported, not the installed one"
    assert got["dirs"] == [str(tmp_path.resolve() / "experiments"), str(package / "experiments")]
    assert Path(got["experiment"]) == package / "experiments" / "gpipe_4gpu.yaml"
    for name in ("pp", "compare"):
        path = Path(got[name])
        assert path.is_file() and path.parent == package / "slurm", got[name]
    assert got["checkout"] is None
    # jobs run from where sbatch is called, with this interpreter (there is no .venv beside an install)
    assert Path(got["PPX_DIR"]) == tmp_path.resolve() and got["PYTHON"] == got["python"]


def test_installed_package_runs_a_shipped_experiment_from_elsewhere(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runs = tmp_path / "runs"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppx.cli",
            "run",
            "gpipe_4gpu",
            "train.steps=2",
            "logging.wandb.mode=disabled",
            f"run.root={runs}",
        ],
        cwd=elsewhere,
        env=_env(installed),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summaries = list(runs.glob("gpipe_4gpu/*/summary.json"))
    assert len(summaries) == 1, r.stdout[-3000:]
    assert "step 1 (2/2)" in r.stdout + r.stderr


@pytest.mark.skipif(not _has_setuptools(), reason="builds the sdist with this interpreter's setuptools (>=64)")
def test_sdist_carries_the_experiments_and_templates(tmp_path):
    """`pip install ppx-*.tar.gz` builds from the sdist, which must hold the mapped folders."""
    src = _source(tmp_path)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))",
            str(tmp_path / "dist"),
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    import tarfile

    with tarfile.open(tmp_path / "dist" / r.stdout.strip().splitlines()[-1]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for folder, pattern in (("experiments", "*.yaml"), ("slurm", "*.sbatch")):
        for p in (REPO / folder).glob(pattern):
            assert f"{folder}/{p.name}" in names
