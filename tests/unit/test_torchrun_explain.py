"""ppx's torchrun under srun (`ppx.launch.torchrun._explain`, PPX_RUN_DIR set by
slurm/pp.sbatch): a rank of its node killed by a signal is named with the action its status
file holds, once for the job; a rank that raised is left to its own line."""

from __future__ import annotations

import signal

from ppx.launch.torchrun import _explain
from ppx.launch.watchdog import cause_path, status_path

KILLED = "rank 1 died: killed by signal SIGKILL (9) on 1F3 (step 2)"


def _run(tmp_path):
    status = tmp_path / "status"
    status.mkdir()
    status_path(status, 1).write_text("1F3 (step 2)")
    return tmp_path, status


def test_a_killed_rank_is_named_with_its_action_and_kept_as_the_cause(tmp_path, capsys):
    run, status = _run(tmp_path)
    # torchrun SIGTERMed rank 0 after rank 1 died: a consequence, not named
    assert _explain(run, [(0, -signal.SIGTERM), (1, -signal.SIGKILL)])
    assert capsys.readouterr().err == f"ppx: error: {KILLED}\n"
    assert cause_path(status).read_text() == KILLED + "\n"
    assert (run / "incomplete.txt").read_text() == KILLED + "\n"


def test_a_cause_a_peer_named_first_is_not_printed_again(tmp_path, capsys):
    run, status = _run(tmp_path)
    cause_path(status).write_text("rank 1 died on 1F3 (step 2): its heartbeat stopped\n")
    assert _explain(run, [(1, -signal.SIGKILL)])
    assert capsys.readouterr().err == ""
    assert cause_path(status).read_text() == "rank 1 died on 1F3 (step 2): its heartbeat stopped\n"
    assert (run / "incomplete.txt").read_text() == KILLED + "\n"


def test_a_rank_that_raised_is_left_to_its_own_line(tmp_path, capsys):
    run, status = _run(tmp_path)
    assert not _explain(run, [(1, 1)])
    assert capsys.readouterr().err == "" and not cause_path(status).exists()
    assert not (run / "incomplete.txt").exists()


def test_a_rank_killed_before_its_first_status_says_so(tmp_path, capsys):
    run, status = _run(tmp_path)
    assert _explain(run, [(3, -signal.SIGKILL)])
    assert capsys.readouterr().err == (
        "ppx: error: rank 3 died: killed by signal SIGKILL (9) on start-up (before its first status)\n"
    )
