"""ppx's torchrun outside `ppx run` (`ppx.launch.torchrun`; under srun PPX_RUN_DIR is set by
slurm/pp.sbatch): a rank of its node killed by a signal is named with the action its status
file holds, once for the job; a rank that raised is left to its own line; the run's
incomplete.txt gets what each launcher saw; a launcher stopped by a signal, or cut from its
rendezvous, says so in one line. torchrun's own entry is replaced by one that raises as
torch's would."""

from __future__ import annotations

import signal

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from ppx.launch import torchrun
from ppx.launch.watchdog import cause_path, status_path

KILLED = "rank 1 died: killed by signal SIGKILL (9) on 1F3 (step 2)"


@pytest.fixture
def run(tmp_path, monkeypatch):
    status = tmp_path / "status"
    status.mkdir()
    status_path(status, 1).write_text("1F3 (step 2)")
    monkeypatch.setenv("PPX_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("PPX_TORCHRUN_EXITS", raising=False)
    return tmp_path


def _torchrun_raises(monkeypatch, error: BaseException) -> None:
    def main(argv):
        raise error

    monkeypatch.setattr(torchrun, "torchrun_main", main)


def _failed(tmp_path, codes: dict[int, int]) -> ChildFailedError:
    failures = {
        rank: ProcessFailure(rank, 100 + rank, code, str(tmp_path / "none.json")) for rank, code in codes.items()
    }
    return ChildFailedError("ppx.cli", failures)


def test_a_killed_rank_is_named_with_its_action_and_kept_as_the_cause(run, monkeypatch, capsys):
    # torchrun SIGTERMed rank 0 after rank 1 died: a consequence, not named
    _torchrun_raises(monkeypatch, _failed(run, {0: -signal.SIGTERM, 1: -signal.SIGKILL}))
    assert torchrun.main([]) == 1
    assert capsys.readouterr().err == f"ppx: error: {KILLED}\n"
    assert cause_path(run / "status").read_text() == KILLED + "\n"
    assert (run / "incomplete.txt").read_text() == KILLED + "\n"


def test_a_cause_a_peer_named_first_is_not_printed_again(run, monkeypatch, capsys):
    peer = "rank 1 died on 1F3 (step 2): its process ended (rank 0 was on wait 0RECV_F3 from rank 1 (step 2))"
    cause_path(run / "status").write_text(peer + "\n")
    (run / "incomplete.txt").write_text("what another node's launcher saw\n")
    _torchrun_raises(monkeypatch, _failed(run, {1: -signal.SIGKILL}))
    assert torchrun.main([]) == 1
    assert capsys.readouterr().err == ""
    assert cause_path(run / "status").read_text() == peer + "\n"
    assert (run / "incomplete.txt").read_text() == "what another node's launcher saw\n" + KILLED + "\n"


def test_a_rank_that_raised_is_left_to_its_own_line(run, monkeypatch, capsys):
    cause_path(run / "status").write_text("rank 1 failed on 1F3 (step 2): RuntimeError: boom\n")
    _torchrun_raises(monkeypatch, _failed(run, {1: 1}))
    assert torchrun.main([]) == 1
    assert capsys.readouterr().err == "torchrun: ppx.cli failed: rank 1: exit code 1\n"
    assert (run / "incomplete.txt").read_text() == "rank 1 failed on 1F3 (step 2): RuntimeError: boom\n"


def test_a_rank_killed_before_its_first_status_says_so(run, monkeypatch, capsys):
    _torchrun_raises(monkeypatch, _failed(run, {3: -signal.SIGKILL}))
    assert torchrun.main([]) == 1
    assert capsys.readouterr().err == (
        "ppx: error: rank 3 died: killed by signal SIGKILL (9) on start-up (before its first status)\n"
    )


def test_without_a_run_directory_the_exit_codes_are_listed(run, monkeypatch, capsys):
    monkeypatch.delenv("PPX_RUN_DIR")
    _torchrun_raises(monkeypatch, _failed(run, {1: -signal.SIGKILL}))
    assert torchrun.main([]) == 1
    assert capsys.readouterr().err == "torchrun: ppx.cli failed: rank 1: exit code -9 (SIGKILL)\n"
    assert not cause_path(run / "status").exists() and not (run / "incomplete.txt").exists()


def test_a_launcher_stopped_by_a_signal_says_so_in_one_line(run, monkeypatch, capsys):
    _torchrun_raises(monkeypatch, SignalException("Process 7 got signal: 15", sigval=signal.SIGTERM))
    assert torchrun.main([]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "torchrun: stopped by SIGTERM: its ranks were ended\n"


def test_a_lost_rendezvous_is_one_line_with_its_inner_cause(run, monkeypatch, capsys):
    try:
        try:
            raise ConnectionError("Failed to recv, got 0 bytes.\nException raised from recvBytes at Utils.hpp:787")
        except ConnectionError as inner:
            raise RendezvousConnectionError("The connection to the C10d store has failed.") from inner
    except RendezvousConnectionError as e:
        _torchrun_raises(monkeypatch, e)
    assert torchrun.main([]) == 1
    assert capsys.readouterr().err == (
        "torchrun: The connection to the C10d store has failed. (Failed to recv, got 0 bytes.); "
        "if the launcher holding it ended, its node's output says why\n"
    )
