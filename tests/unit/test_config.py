"""The config schema: layering, validation, and documentation of every key."""

from __future__ import annotations

import pytest

from helpers import REPO
from ppx import config
from ppx.errors import UserError


def test_layering_defaults_experiment_overrides():
    cfg = config.load("gpipe_4gpu", ["train.steps=3", "pipeline.layers_per_stage=[1,2,2,3]"])
    assert cfg.pipeline.schedule == "gpipe" and cfg.pipeline.stages == 4  # from the YAML
    assert cfg.train.steps == 3 and cfg.pipeline.layers_per_stage == [1, 2, 2, 3]  # overrides
    assert cfg.train.optimizer == "sgd" and cfg.runtime.timeout_s == 60.0  # defaults
    assert cfg.run.name == "gpipe_4gpu"


def test_experiment_by_path_and_round_trip(tmp_path):
    exp = tmp_path / "mine.yaml"
    exp.write_text("pipeline:\n  stages: 3\nmodel:\n  layers: 6\n")
    cfg = config.load(str(exp), [])
    assert cfg.run.name == "mine" and cfg.pipeline.stages == 3
    (tmp_path / "config.yaml").write_text(config.to_yaml(cfg))
    assert config.from_yaml(tmp_path / "config.yaml") == cfg


def test_every_shipped_experiment_loads():
    names = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml"))
    assert {"naive_4gpu", "gpipe_4gpu", "1f1b_4gpu", "gpipe_2cpu", "1f1b_2cpu"} <= set(names)
    for name in names:
        config.load(name, [])


def test_every_key_is_documented_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for key, default, help in config.describe():
        assert help, f"{key} has no help text"
        assert f"| `{key}` | `{default}` |" in readme, f"README's key table misses {key}"


def test_schedule_csv_must_match_stages(tmp_path):
    from ppx import schedules

    path = tmp_path / "s.csv"
    schedules.write_csv(schedules.build("1f1b", 2, 4).compute_only(), path)
    cfg = config.load(None, [f"pipeline.schedule={path}", "pipeline.stages=2", "pipeline.microbatches=4"])
    assert cfg.pipeline.schedule == str(path)
    with pytest.raises(UserError, match="is for 2 ranks and 4 microbatches"):
        config.load(None, [f"pipeline.schedule={path}", "pipeline.stages=3"])


def test_traceable_kinds_are_those_that_name_their_blocks():
    from ppx import models

    for k in models.KINDS:
        assert hasattr(models.kind(k), "block_name") == (k in models.TRACEABLE), k


def test_the_launcher_checks_a_config_without_importing_torch():
    # every `ppx run` claims its run directory before any rank starts; torch costs it ~1.5 s
    import subprocess
    import sys

    code = ("import sys; from ppx import config; from ppx.launch import devices, claim, processes, slurm; "
            "cfg = config.load('gpipe_4gpu', ['model.kind=synthetic', 'pipeline.split=layers']); "
            "config.resolve_schedule(cfg); devices.choose_device('cpu', 4); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_cpu_blocks_split_the_cpus_and_share_them_round_robin():
    from ppx.launch.affinity import cpu_block, describe

    assert [cpu_block(r, 2, [0, 1]) for r in range(2)] == [[0], [1]]
    assert [cpu_block(r, 4, [0, 1]) for r in range(4)] == [[0], [1], [0], [1]]  # neighbours apart
    assert [cpu_block(r, 5, [0, 1]) for r in range(5)] == [[0], [1], [0], [1], [0]]
    assert [cpu_block(r, 3, [4, 5, 6, 7, 8, 9, 10, 11]) for r in range(3)] == [[4, 5], [6, 7, 8], [9, 10, 11]]
    blocks = [cpu_block(r, 5, range(16)) for r in range(5)]
    assert sorted(c for b in blocks for c in b) == list(range(16))  # every CPU used once
    assert describe([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_run_directories_claimed_in_one_second_are_distinct(tmp_path):
    from ppx.launch.claim import claim

    cfg = config.load("gpipe_2cpu", [f"run.root={tmp_path}"])
    first, second, third = claim(cfg), claim(cfg), claim(cfg)  # within a second, mostly: same stamp
    assert len({first, second, third}) == 3 and all(p.is_dir() for p in (first, second, third))
    stamp = first.name
    if second.name.startswith(stamp):
        assert second.name == f"{stamp}-1"


def test_srun_task_variables_become_torch_distributed_env():
    from ppx.launch.processes import launched_by
    from ppx.launch.slurm import adopt_srun_env

    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "5", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "3,2(x1)",
           "SLURM_NODEID": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "12345", "MASTER_ADDR": "10.0.0.1"}
    assert launched_by(env) == "srun"
    adopt_srun_env(env)
    # node 1 of a 3+2 job: this node's 2 tasks
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("3", "5", "1", "2")
    assert env["MASTER_PORT"] == str(20000 + 12345 % 20000) and env["MASTER_ADDR"] == "10.0.0.1"
    assert launched_by(env) == "torchrun"  # the translated variables read as torch.distributed's
    assert launched_by({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}) is None  # one task: launch
