"""Starting and keeping processes: torchrun and srun, devices, each rank's worker, the
watchdog and fault injection, run directories, env.json, sweeps and SLURM."""
