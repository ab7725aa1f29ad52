"""srun-started tasks (ppx.launch.slurm, ppx.launch.processes)."""

from ppx.launch.processes import launched_by
from ppx.launch.slurm import adopt_srun_env


def test_srun_task_variables_become_torch_distributed_env():

    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "5",
        "SLURM_LOCALID": "1",
        "SLURM_TASKS_PER_NODE": "3,2(x1)",
        "SLURM_NODEID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "12345",
        "MASTER_ADDR": "10.0.0.1",
    }
    assert launched_by(env) == "srun"
    adopt_srun_env(env)
    # node 1 of a 3+2 job: this node's 2 tasks
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("3", "5", "1", "2")
    assert env["MASTER_PORT"] == str(20000 + 12345 % 20000) and env["MASTER_ADDR"] == "10.0.0.1"
    assert launched_by(env) == "torchrun"  # the translated variables read as torch.distributed's
    assert launched_by({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}) is None  # one task: launch
