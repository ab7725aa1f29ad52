"""Multi-node runs: `sbatch --nodes 2 slurm/pp.sbatch` on a real two-node SLURM cluster
started by the test, and `torchrun --nnodes 2` with two launchers on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from helpers import REPO, free_port, read_json
from helpers.slurm_cluster import Cluster, why_unavailable

pytestmark = pytest.mark.plain_agent  # jobs on nodes, as a user's are (tests/conftest.py)

ARGS = [
    "model.hidden=32",
    "train.steps=3",
    "train.batch_size=16",
    "logging.wandb.mode=disabled",
    "logging.report=false",
]


def local_losses(shared_run, experiment: str) -> list[float]:
    """The losses of ``experiment`` run on this machine with ``ARGS`` (the gpipe_4gpu run is
    tests/e2e/test_run.py's four-stage run: the same arguments, run once a session)."""
    return read_json(shared_run(experiment, *ARGS).dir / "summary.json")["losses"]


@pytest.fixture(scope="module")
def single_node_losses(shared_run):
    return local_losses(shared_run, "gpipe_4gpu")


def test_torchrun_two_launchers_on_loopback(tmp_path, single_node_losses):
    port, d = free_port(), tmp_path / "run"

    def cmd(node):
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=2",
            f"--node-rank={node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=ppx-test",
            "-m",
            "ppx.cli",
            "run",
            "gpipe_4gpu",
            *ARGS,
            f"run.dir={d}",
        ]

    launchers = [
        subprocess.Popen(cmd(n), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (0, 1)
    ]
    outs = [p.communicate(timeout=240) for p in launchers]
    for p, (_out, err) in zip(launchers, outs):
        assert p.returncode == 0, err[-3000:]
    env = read_json(d / "env.json")
    assert env["world_size"] == 4
    assert Counter(r["node_rank"] for r in env["ranks"]) == {0: 2, 1: 2}
    assert read_json(d / "summary.json")["losses"] == pytest.approx(single_node_losses, rel=1e-6)


unavailable = why_unavailable()
# CI sets PPX_REQUIRE_SLURM=1: there a cluster that cannot start fails the tests, never skips them
skip_without_slurm = pytest.mark.skipif(
    unavailable is not None and os.environ.get("PPX_REQUIRE_SLURM") != "1",
    reason=f"SLURM cannot be started here: {unavailable}",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if unavailable is not None:
        pytest.fail(f"PPX_REQUIRE_SLURM=1 but SLURM cannot be started here: {unavailable}")
    c = Cluster(tmp_path_factory.mktemp("slurm")).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def one_pipeline_losses(shared_run):
    """Two stages, one replica, the same global batch: what pp=2 x dp=2 must reproduce."""
    return local_losses(shared_run, "gpipe_2cpu")


def sbatch_two_nodes(cluster: Cluster, submit, experiment: str, args: list[str], nproc_per_node: int) -> str:
    """``sbatch --nodes 2 slurm/pp.sbatch`` from ``submit`` with ``experiment`` and ``args``: the job id."""
    env = {
        "EXP": experiment,
        "ARGS": " ".join(args),
        "NPROC_PER_NODE": str(nproc_per_node),
        "PPX_DIR": str(REPO),
        "PYTHON": sys.executable,
    }
    return cluster.sbatch("--nodes", "2", str(REPO / "slurm" / "pp.sbatch"), cwd=submit, env=env)


@skip_without_slurm
def test_sbatch_trains_pipeline_by_data_parallel_across_two_slurm_nodes(cluster, tmp_path, one_pipeline_losses):
    """pp=2 x dp=2 on two nodes of two processes: each node holds one pipeline rank's two
    replicas (their reduction stays on the node), the pipeline's hand-offs cross nodes."""
    submit = tmp_path / "submit"
    submit.mkdir()  # no runs/ in it: the job's output must not depend on one
    job = sbatch_two_nodes(cluster, submit, "gpipe_2cpu", [*ARGS, "parallel.data=2"], nproc_per_node=2)
    state = cluster.wait(job, timeout_s=300)
    log = (submit / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert f"ppx: job {job} on 2 node(s) [n[1-2]], 2 process(es) per node, rendezvous 127.0.0.1:" in log
    run = submit / "runs" / "gpipe_2cpu" / f"slurm-{job}"
    assert f"ppx: run directory: {run}" in log
    env = read_json(run / "env.json")
    assert env["world_size"] == 4
    node = {r["rank"]: r["slurm_node"] for r in env["ranks"]}
    assert Counter(node.values()) == {"n1": 2, "n2": 2}
    assert node[0] == node[1] != node[2] == node[3]  # global rank = pipeline rank x 2 + replica
    assert {r["slurm_job_id"] for r in env["ranks"]} == {job}
    summary = read_json(run / "summary.json")
    assert (summary["world_size"], summary["data_parallel"]) == (2, 2)
    assert summary["losses"] == pytest.approx(one_pipeline_losses, rel=1e-5)
    assert all(r["dp_comm_s"] > 0 for r in summary["ranks"])
    assert (run / "slurm.out").resolve() == (submit / f"slurm-{job}.out").resolve()  # the run points to its log


@skip_without_slurm
def test_sbatch_names_a_killed_rank_and_its_action_in_one_line(cluster, tmp_path):
    """Rank 1 of a two-node job dies on 1F1 (SIGKILL): the job fails, and its output names
    the rank and the action once (its node's launcher, or its peer, whichever sees it first),
    with no traceback from the launchers srun ends after it."""
    job = sbatch_two_nodes(cluster, tmp_path, "1f1b_2cpu", [*ARGS, "runtime.inject_fault=die@1F1"], nproc_per_node=1)
    assert cluster.wait(job, timeout_s=300) == "FAILED"
    log = (tmp_path / f"slurm-{job}.out").read_text()
    ours = [line for line in log.splitlines() if line.startswith("ppx: error:")]
    assert len(ours) == 1 and ours[0].startswith("ppx: error: rank 1 died"), log[-3000:]
    assert " on 1F1 (step 0)" in ours[0], ours
    assert "Traceback" not in log, log[-3000:]
    run = tmp_path / "runs" / "1f1b_2cpu" / f"slurm-{job}"
    assert (run / "status" / "cause.txt").read_text() == ours[0].removeprefix("ppx: error: ") + "\n"
    # its node's launcher saw the signal: the run keeps that too, whoever named it first
    assert "rank 1 died: killed by signal SIGKILL (9) on 1F1 (step 0)\n" in (run / "incomplete.txt").read_text()


@skip_without_slurm
def test_srun_started_ranks_run_in_place(cluster, tmp_path, single_node_losses):
    """`srun ... ppx run` (no torchrun): each task takes its rank from SLURM's variables and
    the rendezvous address from the first node's NodeAddr. Two stages, one per node (a test
    node has one CPU): the same losses as the four-stage run on one node."""
    d = tmp_path / "run"
    r = subprocess.run(
        [
            "srun",
            "--nodes=2",
            "--ntasks=2",
            "--kill-on-bad-exit=1",
            sys.executable,
            "-m",
            "ppx.cli",
            "run",
            "gpipe_4gpu",
            *ARGS,
            "pipeline.stages=2",
            f"run.dir={d}",
        ],
        cwd=REPO,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    env = read_json(d / "env.json")
    assert env["world_size"] == 2
    assert Counter(r["slurm_node"] for r in env["ranks"]) == {"n1": 1, "n2": 1}
    assert read_json(d / "summary.json")["losses"] == pytest.approx(single_node_losses, rel=1e-6)


@skip_without_slurm
def test_sweep_on_slurm_submits_a_job_per_point_and_a_comparison(cluster, tmp_path):
    """Each point a pp=2 x dp=2 job over two nodes of two processes."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppx.cli",
            "sweep",
            "1f1b_2cpu",
            "--launcher",
            "slurm",
            "--sweep",
            "pipeline.microbatches=2,4",
            "train.steps=2",
            "parallel.data=2",
            "logging.wandb.mode=disabled",
            "logging.report=false",
            f"run.root={tmp_path}",
        ],
        cwd=REPO,
        env={**cluster.env, "PPX_SBATCH_ARGS": "--nodes 2", "NPROC_PER_NODE": "2", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    jobs = [
        line.split()[4].rstrip(":") for line in r.stdout.splitlines() if line.startswith("ppx sweep: submitted job")
    ]
    compare_job = next(line.split()[4] for line in r.stdout.splitlines() if "comparison job" in line)
    assert len(jobs) == 2
    for job in jobs + [compare_job]:
        assert cluster.wait(job, timeout_s=300) == "COMPLETED", job
    (sweep,) = (tmp_path / "1f1b_2cpu").glob("sweep-*")
    assert sorted(p.name for p in sweep.iterdir() if (p / "summary.json").exists()) == [
        "microbatches=2",
        "microbatches=4",
    ]
    assert all(read_json(p / "summary.json")["data_parallel"] == 2 for p in sweep.glob("microbatches=*"))
    assert (sweep / "compare.md").read_text().count("| microbatches=") == 2
    # its runs drew no pages (logging.report=false): the comparison job draws none either, as a local sweep's
    assert not (sweep / "bubble.png").exists() and not (sweep / "report.html").exists()
