"""A rank killed on another node is named: two torchrun nodes on this machine, the second in
namespaces of its own so that its processes cannot be looked up from the first. Killed on the
node without the rendezvous store, its peer names it from its heartbeat; killed on the node
whose launcher holds the store (c10d, as slurm/pp.sbatch starts a job), that launcher names
it, since the other nodes' launchers end their ranks before any could."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, free_port
from helpers.job import RANK0_UNTIL_B1
from ppx.launch.heartbeat import pid_namespace, read_beats
from ppx.launch.watchdog import read_status, status_path

# a pid namespace of its own (and a user namespace, so that no privilege is needed where the
# kernel lets users make them): processes that cannot be looked up from outside it. Its first
# process dies with unshare (--kill-child), and every other one of the namespace with it.
OWN_PID_NAMESPACE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child"]


def _own_pid_namespace_works() -> bool:
    try:
        return subprocess.run([*OWN_PID_NAMESPACE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = [
    pytest.mark.skipif(not _own_pid_namespace_works(), reason="needs unshare --user --pid (namespaces of its own)"),
    pytest.mark.plain_agent,  # how a job starts and ends, as a user's does (tests/conftest.py)
]


class TwoNodes:
    """``with TwoNodes(...) as nodes:`` two torchrun launchers (``python -m launcher``,
    ``--node-rank=<k>`` under a static rendezvous, then ``args``): node 0 here, node 1 in a pid
    namespace of its own; each one's stderr in a file (no pipe left unread to fill). ``port``:
    node 0's c10d rendezvous store, listening before node 1 starts. Whatever is left of the job
    at the end is killed: both launchers, node 1's namespace with its own, and node 0's ranks
    (in sessions of their own), found by the heartbeats in ``status``."""

    def __init__(
        self, tmp_path: Path, launcher: str, args: list[str], status: Path, env: dict | None = None, port: int = 0
    ):
        self.tmp_path, self.status, self.nodes = tmp_path, status, []
        for k, wrap in enumerate(([], OWN_PID_NAMESPACE)):
            with open(tmp_path / f"node{k}.err", "w") as err:
                rank = [] if port else [f"--node-rank={k}"]
                cmd = [*wrap, sys.executable, "-m", launcher, *rank, *args]
                self.nodes.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, env=env))
            if k == 0 and port:
                _wait(lambda: _listening(port), f"node 0's rendezvous store on port {port}")

    def __enter__(self) -> TwoNodes:
        return self

    def __exit__(self, *exc) -> None:
        for node in self.nodes:
            node.kill()
        beats = read_beats(self.status) if self.status.is_dir() else {}
        for beat in beats.values():
            if beat.pidns == pid_namespace():
                with contextlib.suppress(OSError):
                    os.kill(beat.pid, signal.SIGKILL)

    def wait(self) -> tuple[list[int], str]:
        """(each launcher's exit code, their stderr together)."""
        codes = [node.wait(timeout=240) for node in self.nodes]
        return codes, "".join((self.tmp_path / f"node{k}.err").read_text() for k in range(2))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(ready, what: str, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < end, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ppx: error:")]


def test_killed_rank_on_another_node_is_named_by_its_peer(run_dir, tmp_path):
    """Static rendezvous (as srun starts ranks): rank 1 is killed on node 1, and rank 0 names
    it from its heartbeat."""
    args = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    args += ["--max-restarts=0", "-m", "ppx.cli", "run", "1f1b_2cpu", "runtime.timeout_s=30"]
    args += ["runtime.inject_fault=die@1B1", f"run.dir={run_dir}"]
    with TwoNodes(tmp_path, "torch.distributed.run", args, run_dir / "status") as nodes:
        codes, err = nodes.wait()
    assert all(code != 0 for code in codes), codes
    ours = _errors(err)
    assert len(ours) == 1, err[-3000:]
    # rank 0 waits on one of rank 1's gradients (which, the killed send's timing decides)
    assert re.fullmatch(
        rf"ppx: error: rank 1 died on 1B1 \(step 0\): its heartbeat stopped \(rank 0 was on {RANK0_UNTIL_B1} \(step 0\)\)",
        ours[0],
    ), ours
    assert (run_dir / "status" / "cause.txt").read_text() == ours[0].removeprefix("ppx: error: ") + "\n"


def test_killed_rank_on_the_rendezvous_node_is_named_by_its_launcher(run_dir, tmp_path):
    """c10d rendezvous through ppx's torchrun, as slurm/pp.sbatch starts a job: the rank on the
    node whose launcher holds the store is killed mid-run (as the OOM killer would), and that
    launcher names it, its signal and its action, in the job's one line."""
    port = free_port()
    args = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
    args += ["--rdzv-id=ppx-test", "--max-restarts=0", "-m", "ppx.cli", "run", "1f1b_2cpu", "runtime.timeout_s=30"]
    args += ["train.steps=100000", f"run.dir={run_dir}"]
    status = run_dir / "status"

    def training() -> bool:  # both ranks beat, and each is in a step past the first
        beats = read_beats(status) if status.is_dir() else {}
        return len(beats) == 2 and all(re.search(r"step [1-9]", read_status(status_path(status, r))) for r in beats)

    env = dict(os.environ, PPX_RUN_DIR=str(run_dir))
    with TwoNodes(tmp_path, "ppx.launch.torchrun", args, status, env, port) as nodes:
        _wait(training, "two ranks in a step past the first")
        (here,) = [b for b in read_beats(status).values() if b.pidns == pid_namespace()]
        os.kill(here.pid, signal.SIGKILL)
        codes, err = nodes.wait()
    assert all(code != 0 for code in codes), codes
    ours = _errors(err)
    assert len(ours) == 1, err[-3000:]
    where = r"[^;]+ \(step \d+\)"  # whatever its status said: an action, a wait, the optimizer step, ...
    assert re.fullmatch(rf"ppx: error: rank {here.rank} died: killed by signal SIGKILL \(9\) on {where}", ours[0]), ours
    assert (status / "cause.txt").read_text() == ours[0].removeprefix("ppx: error: ") + "\n"
    assert (run_dir / "incomplete.txt").read_text() == ours[0].removeprefix("ppx: error: ") + "\n"
    # the other node's launcher lost the store with it: one line, not torch's traceback (or, where
    # its rank's failed wait ended it first, after the cause was named, the rank's exit code)
    lost = "torchrun: The connection to the C10d store has failed" in err
    assert lost or re.search(r"torchrun: \S+ failed: rank \d+: exit code 1", err), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
