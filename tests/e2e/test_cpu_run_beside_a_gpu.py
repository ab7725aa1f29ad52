"""A CPU run on a machine with a GPU: its ranks see no GPU (`ppx.launch.devices.CPU_ONLY`).

Without that, torch's optimizer step starts CUDA in every CPU rank, and ranks forked from
torchrun's agent (a CPU run's default) fail their first step with "CUDA error: initialization
error" (an H200 host, 2026-11-30). The CUDA tests run there; the first test runs everywhere."""

from __future__ import annotations

import pytest

from helpers import CUDA_DEVICES, GPU_ENV, ppx, read_json, torchrun_ppx
from ppx.launch.processes import worker_env

NEEDS_GPU = pytest.mark.skipif(CUDA_DEVICES == 0, reason="needs a CUDA GPU")


def test_a_cpu_runs_ranks_see_no_gpu_and_a_gpu_runs_see_the_users(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert worker_env("cpu", 1, "ppx run x")["CUDA_VISIBLE_DEVICES"] == ""
    assert worker_env("cuda", 1, "ppx run x")["CUDA_VISIBLE_DEVICES"] == "0,1"


@NEEDS_GPU
def test_forked_cpu_ranks_beside_a_gpu_take_their_optimizer_steps(tmp_path):
    """llama-tiny with AdamW on 2 forked CPU ranks, the GPU visible to `ppx run`."""
    d = tmp_path / "run"
    r = ppx("run", "llama_tiny_1f1b_2cpu", "train.steps=2", f"run.dir={d}", env=GPU_ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    s = read_json(d / "summary.json")
    assert s["device"] == "cpu" and s["status"] == "completed"
    assert read_json(d / "env.json")["nccl"] is None  # (rank 0 found no CUDA: its GPU hidden)


@NEEDS_GPU
@pytest.mark.skipif(CUDA_DEVICES >= 4, reason="needs fewer GPUs than gpipe_4gpu's 4 processes")
def test_too_few_gpus_fall_back_to_a_cpu_run_that_completes(tmp_path):
    d = tmp_path / "run"
    r = ppx("run", "gpipe_4gpu", "train.steps=2", f"run.dir={d}", env=GPU_ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "running on CPU with gloo" in r.stderr
    assert read_json(d / "summary.json")["device"] == "cpu"


def _torchrun(nproc: int, *args: str):
    """``ppx run <args>`` in each of ``nproc`` processes of a torchrun job (as under srun), the GPUs visible."""
    return torchrun_ppx(nproc, "run", *args, "train.steps=2", "logging.wandb.mode=disabled", env=GPU_ENV)


@NEEDS_GPU
def test_cpu_ranks_started_by_torchrun_beside_a_gpu_complete(tmp_path):
    """runtime.device=cpu in the experiment."""
    d = tmp_path / "run"
    r = _torchrun(2, "llama_tiny_1f1b_2cpu", f"run.dir={d}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert read_json(d / "summary.json")["device"] == "cpu"
    assert read_json(d / "env.json")["nccl"] is None


@NEEDS_GPU
@pytest.mark.skipif(CUDA_DEVICES >= 4, reason="needs fewer GPUs than the job's processes (at most 4 here)")
def test_ranks_started_by_torchrun_that_fall_back_to_cpu_start_no_cuda(tmp_path):
    """runtime.device=auto with more processes than GPUs: each rank counts the GPUs without
    starting CUDA (`gpu_count(usable=False)`), so the GPUs it then hides stay hidden."""
    d, n = tmp_path / "run", CUDA_DEVICES + 1
    r = _torchrun(n, "1f1b_2cpu", "runtime.device=auto", f"pipeline.stages={n}", f"run.dir={d}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "running on CPU with gloo" in r.stderr
    assert read_json(d / "summary.json")["device"] == "cpu"
    assert read_json(d / "env.json")["nccl"] is None
