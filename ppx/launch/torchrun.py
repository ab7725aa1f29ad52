"""torchrun (``torch.distributed.run``), minus the Python traceback it prints when a worker
fails: ``ppx run`` follows a failed job with its own line naming each rank and the action it
was on, and the workers have already printed theirs. Exit codes are torchrun's, but for a
launcher stopped by a signal: 128 + the signal, with a line saying so. SIGUSR1 and SIGUSR2 (a job
manager's warning, SLURM's ``--signal``) stop it as SIGTERM does, where their default action
ended the agent alone and left its ranks running.

Under ``ppx run`` (``PPX_TORCHRUN_EXITS`` names a file), the failed ranks' exit codes go to
that file as JSON for the launcher to explain (``ppx.launch.supervisor``), instead of a line
of their own; torchrun's own warnings are left out, and it ends quietly when the launcher
ends the job (SIGTERM). It also asks the kernel for a SIGTERM if the launcher dies first
(PR_SET_PDEATHSIG), so that even a ``kill -9`` of ``ppx run`` leaves no job behind.

Under srun (``slurm/pp.sbatch``, where ``PPX_RUN_DIR`` names the run directory), a rank of
this node killed by a signal is named here, with its action, as ``ppx run`` names it: its
peers may not live to (when this launcher holds the c10d rendezvous, the other nodes'
launchers end their ranks as soon as it exits). A launcher that srun (or anyone) stops says
so in one line, not torch's traceback.

An error of torchrun's own (its agent out of file descriptors before it started a rank, torch
failing to import, the rendezvous lost under ``ppx run``) is one line too, not its traceback:
``torchrun could not start the job: OSError: [Errno 24] Too many open files``, the job's cause
(``status/cause.txt``, which ``ppx run`` keeps in ``incomplete.txt``), or under srun
``incomplete.txt`` itself (an error other than the OS's or an import's keeps its traceback in
``status/torchrun.traceback``); torch is imported inside `_main` for that.

When it forks its workers (``--start-method=fork``: CPU runs, `ppx.launch.processes`), it
imports what every worker needs first, once, so that the workers inherit it
(`ppx.launch.forked_worker`).

torch's rendezvous runs without its fixed costs of a job's start and end
(`ppx.launch.lean_rendezvous`: about 0.7 s of a short run).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

from ppx.errors import first_line, said
from ppx.files import write_json
from ppx.launch import lean_rendezvous
from ppx.launch.open_files import needed, raise_soft_limit
from ppx.launch.processes import FORK, follow_parent
from ppx.launch.stops import WARNINGS
from ppx.launch.supervisor import killed, write_incomplete
from ppx.launch.watchdog import cause_path, claim_cause, read_status

FAILED_GRACE_S = 0.5  # a failed forked rank's survivors' time before torchrun's SIGTERM (`_report_every_failed_fork`)


@contextlib.contextmanager
def _stop_on_warnings():
    """While torchrun runs the job, SIGUSR1 and SIGUSR2 (`stops.WARNINGS`: their default action
    ended the agent alone and left its ranks running) end it as SIGTERM does (torchrun
    SIGTERMs its ranks), as they end a ``ppx run``; yields the list that gets the signal, for
    the line and exit code. Once one has come, later ones (torch's shutdown under way) are
    let be; after, the handlers are what they were."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    got: list[int] = []

    def stop(signum, frame):
        if got:
            return
        got.append(signum)
        raise SignalException(f"Process {os.getpid()} got signal: {signal.Signals(signum).name}", signal.SIGTERM)

    before = {sig: signal.signal(sig, stop) for sig in WARNINGS}
    try:
        yield got
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def import_for_the_workers(run_dir: str | None = None) -> None:
    """What each rank would import at its start, here where the forked ranks inherit it:
    the worker's modules, and ``torch._dynamo``, which torch.optim imports at the first step
    (about 1.3 s a rank on a laptop-class CPU, where torch itself takes about 2); and what
    building the model of ``run_dir``'s run imports (`ppx.models.preload`: transformers and the
    architecture's modules, about 4 s a rank)."""
    import torch._dynamo  # noqa: F401

    import ppx.launch.worker  # noqa: F401

    if run_dir is not None:
        _import_the_model(Path(run_dir))
        gc.collect()  # (the model built to find its modules: its cycles are garbage, not to be frozen)
    # everything imported so far, out of the collector's walks: a rank's first collection
    # (`StepCollector`) would otherwise walk torch's objects again (0.17 s a rank) and write to their pages
    gc.freeze()


def _import_the_model(run_dir: Path) -> None:
    from ppx import config, models

    try:
        models.preload(config.from_yaml(run_dir / "config.yaml").model)
    except Exception:  # (each rank reads the config and builds its stage, and says what failed)
        pass


def _report_every_failed_fork() -> None:
    """torchrun's forked workers (``MultiprocessContext``) report only the first rank that
    failed, where started ones report every one: add the others' exit codes, as the launcher
    names a killed rank by its signal whichever rank torchrun saw first. And a failure seen
    while other ranks run is reported (and the survivors SIGTERMed) only ``FAILED_GRACE_S``
    after it was first seen: the survivors' time to name the dead peer and end on their own,
    where torchrun looks every 0.1 s (`ppx.launch.processes.torchrun_command`)."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    first_only = MultiprocessContext.__dict__.get("_poll")  # its own, not PContext's abstract one
    if first_only is None:  # a torch whose private poll is gone: its own report (the first rank) stands
        return

    def poll(self):
        context = getattr(self, "_pc", None)  # torch's private fields: read only where they are
        procs, error_files = getattr(context, "processes", None), getattr(self, "error_files", None)
        if procs is not None and any(p.exitcode not in (None, 0) for p in procs):
            seen = self.__dict__.setdefault("_ppx_failure_seen", time.monotonic())
            if any(p.exitcode is None for p in procs) and time.monotonic() - seen < FAILED_GRACE_S:
                return None
        result = first_only(self)
        if result is not None and result.failures and procs is not None and error_files is not None:
            for failure in result.failures.values():
                # torchrun's poll SIGTERMs the survivors (`close`) before it returns the failure it
                # saw first: a SIGTERM added below may be its own, the one it saw first never (`killed`)
                failure.seen_first = True
            for rank, proc in enumerate(procs):
                if rank not in result.failures and proc.exitcode not in (None, 0):
                    result.failures[rank] = ProcessFailure(rank, proc.pid, proc.exitcode, error_files[rank])
        return result

    MultiprocessContext._poll = poll


def main(argv: list[str]) -> int:
    exits = os.environ.get("PPX_TORCHRUN_EXITS")
    raise_soft_limit(needed(_local_ranks(argv)))  # (under srun no ppx run has: `ppx.launch.open_files`)
    try:
        return _main(argv, exits)
    except Exception as e:  # torchrun's own failure (its ranks' are `_main`'s ChildFailedError)
        return _agent_failed(e, exits)


def _main(argv: list[str], exits: str | None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.run import main as torchrun_main

    if FORK in argv:
        # Python 3.12+ warns at every fork from a process with threads (the agent's store
        # server is one): a line a rank in each job's output, where ppx promises one line per
        # failure; the forked ranks start gloo's, OpenMP's and the store's threads of their own
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded, use of fork\(\)", DeprecationWarning)
        import_for_the_workers(argv[-1])  # (its run directory: `ppx.launch.processes.torchrun_command`'s last)
        _report_every_failed_fork()
    if exits:
        if not follow_parent(os.environ.get("PPX_LAUNCHER_PID")):  # (ppx run is gone: end quietly, as told to)
            os.kill(os.getpid(), signal.SIGTERM)
        for name, logger in list(logging.Logger.manager.loggerDict.items()):  # each sets its own level
            if name.startswith("torch.distributed.elastic") and isinstance(logger, logging.Logger):
                logger.setLevel(logging.CRITICAL)
        # its "Terminating process ... via signal SIGTERM" when a survivor outlives torchrun's grace
        logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.CRITICAL)
    lean_rendezvous.apply(argv)
    try:
        with _stop_on_warnings() as warned:
            torchrun_main(argv)
    except ChildFailedError as e:
        failures = sorted(e.failures.items())
        seen = [(rank, f.exitcode, getattr(f, "seen_first", False)) for rank, f in failures]  # (`killed`'s)
        if exits:
            failed = {
                str(r): {"exitcode": code, "pid": f.pid, "first": first}
                for (r, code, first), (_, f) in zip(seen, failures)
            }
            try:  # (whole or not at all: a part read back as no failure named the killed ranks)
                write_json(exits, failed)
            except OSError:  # (a full disk: the launcher says the job failed and where each rank was)
                pass
            return 1
        summary = f"torchrun: {e.name} failed: " + "; ".join(
            f"rank {rank}: exit code {f.exitcode}" + (f" ({f.signal_name()})" if f.exitcode < 0 else "")
            for rank, f in failures
        )
        run_dir = os.environ.get("PPX_RUN_DIR")
        if run_dir:
            _explain(Path(run_dir), seen, summary)
        else:
            print(summary, file=sys.stderr, flush=True)
        return 1
    except SignalException as e:
        sig = warned[0] if warned else int(e.sigval)
        if not exits:  # srun ending the job's other nodes once one failed (that one said why)
            name = signal.Signals(sig).name
            print(f"torchrun: stopped by {name}: its ranks were ended", file=sys.stderr, flush=True)
        return 128 + sig  # (under ppx run: ended by the launcher, which says why)
    except RendezvousConnectionError as e:
        if exits:  # (`_agent_failed`'s line)
            raise
        inner = f" ({first_line(str(e.__cause__))})" if e.__cause__ is not None else ""
        hint = "if the launcher holding it ended, its node's output says why"
        print(f"torchrun: {e}{inner}; {hint}", file=sys.stderr, flush=True)
        return 1
    return 0


def _local_ranks(argv: list[str]) -> int:
    """This node's ranks, from torchrun's ``--nproc-per-node`` (8 where it names a device kind)."""
    for k, arg in enumerate(argv):
        for flag in ("--nproc-per-node", "--nproc_per_node"):
            if arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            elif arg == flag and k + 1 < len(argv):
                value = argv[k + 1]
            else:
                continue
            return int(value) if value.isdigit() else 8
    return 1


def _agent_failed(e: Exception, exits: str | None) -> int:
    """torchrun's own error ``e`` in one line, "could not start the job" where no rank has a
    status yet: the job's cause, said, unless a rank (under srun, maybe on another node) failed
    first, whose consequence it is (`claim_cause`); under ``ppx run`` (``exits``, in the run's
    status folder) the launcher keeps it; under srun (``PPX_RUN_DIR``) ``incomplete.txt`` does."""
    run_dir = os.environ.get("PPX_RUN_DIR")
    status = Path(exits).parent if exits else Path(run_dir) / "status" if run_dir else None
    started = status is not None and any(status.glob("rank*.txt"))
    line = f"torchrun {'failed while the job ran' if started else 'could not start the job'}: {said(e)}"
    if not isinstance(e, (OSError, ImportError)) and status is not None:  # (a bug's, maybe ppx's: its traceback kept)
        kept = status / "torchrun.traceback"
        with contextlib.suppress(OSError):
            kept.write_text(traceback.format_exc())
            line += f" (its traceback: {kept})"
    if claim_cause(status, line):  # (else a rank failed first: this is its consequence)
        print(f"ppx: error: {line}" if exits else line, file=sys.stderr, flush=True)
    if run_dir and not exits:  # (what this node's launcher saw, said or not)
        write_incomplete(Path(run_dir), [line], append=True)
    return 1


def _explain(run_dir: Path, failures: list[tuple[int, int, bool]], summary: str) -> None:
    """A failed job under srun: each rank of this node that a signal killed is named with the
    action its status file says it was on, as the job's cause unless a peer named it first
    (`claim_cause`); else ``summary`` (a rank that raised has printed its own line). Either
    way ``<run>/incomplete.txt`` gets what this launcher saw."""
    status = run_dir / "status"
    lines = killed(failures, status)
    if lines and claim_cause(status, lines[0]):
        for line in lines:
            print(f"ppx: error: {line}", file=sys.stderr, flush=True)
    elif not lines:
        print(summary, file=sys.stderr, flush=True)
    write_incomplete(run_dir, lines or [read_status(cause_path(status)) or summary], append=True)


def run(argv: list[str]) -> int:
    """`main`, its output flushed: the caller exits with the code at once (``os._exit``): the
    job is over (its workers reaped, the rendezvous closed), and the interpreter's teardown of
    torch would add about 0.3 s to every run's end."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    return code


if __name__ == "__main__":
    os._exit(run(sys.argv[1:]))
