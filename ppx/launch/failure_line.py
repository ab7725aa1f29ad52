"""A failed rank's one line: its own, unless another rank's failure explains it (a peer of
this machine gone, a peer elsewhere whose heartbeat stopped), and only the first cause of the
job is printed (`ppx.launch.watchdog.claim_cause`)."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path

from ppx.errors import raised_at
from ppx.launch.heartbeat import (
    DIED_WITHIN_S,
    Beat,
    gone_peers,
    note_gone,
    silent_peers_elsewhere,
    stopped_responding,
)
from ppx.launch.watchdog import Watchdog, cause_path, claim_cause, launcher_alive, read_status, status_path

REPORTING = threading.Lock()  # held while a failure's line is made (`ppx.launch.stop_signal` waits on it)
STOPPED = threading.Event()  # this rank got a SIGTERM (`ppx.launch.stop_signal`): peers stopped with it are no cause


def report_failure(watchdog: Watchdog | None, message: str, own: bool = False, peer: int | None = None) -> None:
    """This rank's failure in one line, unless another rank failed first (its line is the
    job's cause; this one, a peer gone from under a wait, its consequence) or a peer of this
    machine was killed (it had no time to say so: `ppx run` names it with its signal, from
    torchrun's exit codes; a job without it, as under srun, gets this rank's line naming the
    peer), or a peer on another node whose heartbeat stopped (`_peer_cause`): the status file
    says where this rank failed either way. ``own``: a mistake of this rank's own input (a
    UserError), which no peer's death explains; ``peer``: the rank a failed wait was on."""
    with REPORTING:
        _report(watchdog, message, own, peer)


def kept_traceback(watchdog: Watchdog | None, cause: BaseException) -> str:
    """``cause``'s whole traceback (the exception a rank's line names: an `ActionFailed`'s cause)
    kept in ``status/rank<r>.traceback``; the note naming it for the line where the user's own
    code raised it (a model's forward, a loss function: `ppx.errors.raised_at`), else ``""`` (a
    peer gone, a full disk: the line says it all), as where there is no status folder yet or it
    cannot be written."""
    if watchdog is None:
        return ""
    path = watchdog.status_dir / f"rank{watchdog.rank}.traceback"
    try:
        path.write_text("".join(traceback.format_exception(cause)))
    except OSError:
        return ""
    return f" (its traceback: {path})" if raised_at(cause) else ""


def name_dead_peer(watchdog: Watchdog) -> bool:
    """The line naming a peer of this machine whose process ended, if one did and no rank has
    claimed the job's cause yet, for a rank its launcher stopped before its wait on that peer
    failed (`ppx.launch.stop_signal`); True if a peer died. This rank's heartbeat first says
    "stopped", and peers that say so are passed over: ranks stopped together (scancel) do not
    name each other."""
    status = watchdog.status_dir
    if not watchdog.heartbeat.ended:  # (a rank that ended on its own stays "done")
        watchdog.heartbeat.stop("stopped")
    gone = gone_peers(status, watchdog.rank, wait_s=0.2, stopped=False)
    message = _peer_cause(status, watchdog, gone, None) if gone else None
    if message and not cause_path(status).exists() and claim_cause(status, message):
        sys.stderr.write(f"ppx: error: {message}\n")
        sys.stderr.flush()
    return bool(gone)


def _report(watchdog: Watchdog | None, message: str, own: bool, peer: int | None) -> None:
    status = watchdog.status_dir if watchdog else None
    if status is not None and not own and not cause_path(status).exists():
        gone = gone_peers(status, watchdog.rank, stopped=not STOPPED.is_set())
        if STOPPED.is_set() and not gone:  # stopped itself, a wait failed on peers stopped with it: no cause
            watchdog.phase(f"stopped on {watchdog.label}")
            return
        if gone and launcher_alive():
            note_gone(status, [b.rank for b in gone])  # (the launcher names them, SIGTERM'd ones too)
            watchdog.phase(f"failed {'after' if watchdog.finished else 'on'} {watchdog.label}")
            return
        message = _peer_cause(status, watchdog, gone, peer) or message
    if claim_cause(status, message):
        sys.stderr.write(f"ppx: error: {message}\n")
        sys.stderr.flush()
    if watchdog is not None:
        watchdog.phase(f"failed on {watchdog.label}")


def _peer_cause(status: Path, watchdog: Watchdog, gone: list[Beat], waited_on: int | None) -> str | None:
    """The line naming the peer whose end failed this rank: one of ``gone`` (peers of this
    machine whose process ended) or, without one, a peer elsewhere whose heartbeat stopped
    (died if its last beat is recent, frozen if it is old: the wait timed out on it). None
    when no peer explains the failure."""
    how = "its process ended"
    if not gone:  # a peer on another node: its pid cannot be looked up here, its heartbeat can
        gone, how = silent_peers_elsewhere(status, watchdog.rank), "its heartbeat stopped"
    if not gone:
        return None
    peer = _blamed(gone, waited_on)
    if peer.state == "stopped":  # its own SIGTERM, no peer's death, ended it (`name_dead_peer`)
        how = "a SIGTERM ended it"
    where = read_status(status_path(status, peer.rank)) or "start-up"
    silent_s = time.time() - peer.wall
    if how == "its heartbeat stopped" and silent_s > DIED_WITHIN_S:
        seen = f" (seen by rank {watchdog.rank}, failed on {watchdog.where()})"
        return stopped_responding(peer.rank, silent_s, where) + seen
    return f"rank {peer.rank} died on {where}: {how} (rank {watchdog.rank} was on {watchdog.where()})"


def _blamed(peers: list[Beat], waited_on: int | None) -> Beat:
    """Of several silent peers (those killed, where some were: one a SIGTERM stopped is no cause
    beside one), the one this rank's failed wait was on, else the one whose beat stopped first:
    a launcher ends a killed rank's neighbours after it, and theirs stop later."""
    pool = [b for b in peers if b.state == "alive"] or peers
    on = [b for b in pool if b.rank == waited_on]
    return on[0] if on else min(pool, key=lambda b: b.wall)
