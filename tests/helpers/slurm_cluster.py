"""A real SLURM cluster on this machine for the tests: munged, slurmctld and two slurmd
"nodes" (n1, n2) on loopback ports, configured in a temporary folder. Debian's slurm-wlm
and munge provide the daemons (.ci/run installs them)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "squeue")
# a job's states once it has ended (COMPLETING is not one: its processes are still being ended)
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def why_unavailable() -> str | None:
    """None when a cluster can be started here, else the reason."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"SLURM is not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd here needs root"
    if not Path("/etc/munge/munge.key").exists():
        return "munge has no key (/etc/munge/munge.key)"
    return None


class Cluster:
    def __init__(self, workdir: Path):
        self.dir = workdir
        self.conf = workdir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs: list[subprocess.Popen] = []

    def _write_conf(self) -> None:
        ctl, n1, n2 = _free_ports(3)
        host = socket.gethostname().split(".")[0]
        d = self.dir
        for sub in ("state", "slurmd-n1", "slurmd-n2", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""\
ClusterName=ppxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctl}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/slurmd-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=n[1-2] NodeHostname={host} NodeAddr=127.0.0.1 Port={n1},{n2} CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

    def start(self, timeout_s: float = 60) -> Cluster:
        self._write_conf()
        run = Path("/run/munge")
        run.mkdir(parents=True, exist_ok=True)
        shutil.chown(run, "munge", "munge")
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, timeout=30)
        self.procs.append(
            subprocess.Popen(
                ["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        for node in ("n1", "n2"):
            self.procs.append(
                subprocess.Popen(
                    ["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf)],
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if out.returncode == 0 and len(states) == 2 and all(s in ("idle", "mix", "alloc") for s in states.values()):
                return self
            time.sleep(0.5)
        logs = "\n".join(p.read_text()[-1500:] for p in (self.dir / "log").glob("*.log"))
        self.stop()
        raise RuntimeError(f"SLURM did not come up in {timeout_s} s:\n{logs}")

    def sbatch(self, *args: str, env: dict | None = None, cwd: Path | None = None) -> str:
        out = subprocess.run(
            ["sbatch", "--parsable", *args],
            env={**self.env, **(env or {})},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed: {out.stderr}")
        return out.stdout.strip().split(";")[0]

    def wait(self, job: str, timeout_s: float = 300) -> str:
        """Block until ``job`` has ended and return its final state (COMPLETED, FAILED, ...),
        read from ``scontrol show job`` twice a second. (``sbatch --wait`` on a no-op job that
        depends on it says so too, but it polls at growing intervals, most of a test's time
        when a job takes seconds.) slurmctld keeps an ended job's record for MinJobAge, 300 s
        by default."""
        deadline = time.monotonic() + timeout_s
        while True:
            show = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.env, capture_output=True, text=True)
            if show.returncode != 0:
                raise AssertionError(f"cannot wait for SLURM job {job!r}: {show.stderr.strip()}")
            state = next(w.split("=", 1)[1] for w in show.stdout.split() if w.startswith("JobState="))
            if state in ENDED:
                return state
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job], env=self.env)
                raise AssertionError(f"SLURM job {job} did not end in {timeout_s} s (last state {state})")
            time.sleep(0.5)

    def stop(self) -> None:
        subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=30)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
