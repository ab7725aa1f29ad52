"""A rank killed on another node is named by its peer: two torchrun nodes on this machine,
the second in namespaces of its own so that its processes cannot be looked up from the first."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import REPO, free_port

# a pid namespace of its own (and a user namespace, so that no privilege is needed where the
# kernel lets users make them): processes that cannot be looked up from outside it
OWN_PID_NAMESPACE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]


def _own_pid_namespace_works() -> bool:
    try:
        return subprocess.run([*OWN_PID_NAMESPACE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _own_pid_namespace_works(), reason="needs unshare --user --pid (namespaces of its own)")
def test_killed_rank_on_another_node_is_named_by_its_peer(run_dir, tmp_path):
    """Two torchrun nodes (static rendezvous, as srun starts them), the second in a pid
    namespace of its own, so that its processes cannot be looked up from the first, as on
    another machine: rank 1 is killed there, and rank 0 names it from its heartbeat."""
    port = free_port()
    args = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
    args += ["--max-restarts=0", "-m", "ppx.cli", "run", "1f1b_2cpu", "runtime.timeout_s=30"]
    args += ["runtime.inject_fault=die@1B1", f"run.dir={run_dir}"]
    launch = [sys.executable, "-m", "torch.distributed.run"]
    nodes = []
    try:
        for k, wrap in enumerate(([], OWN_PID_NAMESPACE)):
            with open(tmp_path / f"node{k}.err", "w") as err:  # files: no pipe left unread to fill
                cmd = [*wrap, *launch, f"--node-rank={k}", *args]
                nodes.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err))
        codes = [node.wait(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    err = "".join((tmp_path / f"node{k}.err").read_text() for k in range(2))
    assert all(code != 0 for code in codes), codes
    ours = [line for line in err.splitlines() if line.startswith("ppx: error:")]
    assert len(ours) == 1, err[-3000:]
    # rank 0 waits on one of rank 1's gradients (which, the killed send's timing decides)
    assert re.fullmatch(
        r"ppx: error: rank 1 died on 1B1 \(step 0\): its heartbeat stopped \(rank 0 was on wait 0RECV_B\d from rank 1 \(step 0\)\)",
        ours[0],
    ), ours
    assert (run_dir / "status" / "cause.txt").read_text() == ours[0].removeprefix("ppx: error: ") + "\n"
