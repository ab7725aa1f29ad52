"""The W&B writer: a process of its own, started by rank 0's `WandbSink`, that does all of a
run's W&B work, so that W&B's import, its service and its files cost rank 0 nothing.

It reads one JSON object a line on stdin: ``{"init": {...}}`` (`wandb.init`'s arguments, mode
included) first, then ``{"step": k, "scalars": {...}}`` per step, ``{"start": true}`` once the
run's steps are over, and ``{"finish": {...}}`` with the run's summary once its files are
written. An ``online`` run starts W&B at once and logs each step as it comes (its charts are
live); an ``offline`` one, whose files nobody reads before the run ends, keeps the steps and
starts W&B at ``start``, while rank 0 draws the report (or, a long run's, once it has run
`ppx.report.wandb_sink.KEEP_STEPS` steps). The last ``start`` names the CPUs the writer takes from
then on (the job's; until then it keeps rank 0's). Stdin's end without ``finish`` (rank 0 failed
or was killed), or rank 0 gone while it awaited the writer, lets the writer go (`_let_go`): its
output first, then within `ABANDON_S` the process, a started W&B run ended as failed where W&B
ends by then: nothing waits on a writer that outlived its run.

W&B never fails a run: any failure is said once (online falls back to offline) and logging
stops. Output: ``ppx: W&B offline run: ...`` on stdout, warnings on stderr. It ends only by
stdin's end (Ctrl-C, sent to its process group, is its parent's to act on) or a kill.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

from ppx.files import stdout_to_null

ABANDON_S = 10.0  # at most this long to end a started W&B run whose rank 0 ended without its summary
LET_GO = threading.Event()  # rank 0 is gone (`_let_go`): nothing more starts
PARENT_POLL_S = 0.5  # how often the writer looks whether rank 0 is still there


def _private_output() -> None:
    """The writer's own stdout and stderr on copies that no child inherits, fds 1 and 2 on
    /dev/null: W&B's service, which the writer starts, holds none of ppx run's output."""
    out, err = os.dup(1), os.dup(2)  # (non-inheritable)
    stdout_to_null(sys.stdout)
    stdout_to_null(sys.stderr)
    sys.stdout = open(out, "w", buffering=1)
    sys.stderr = open(err, "w", buffering=1)


def _say(msg: str, stream) -> None:
    """A line to ``stream``; one whose reader has gone (``ppx run ... | head``) is dropped, and
    the stream sent to /dev/null from then on."""
    try:
        print(msg, file=stream, flush=True)
    except (OSError, ValueError):
        stdout_to_null(stream)


def _warn(msg: str) -> None:
    _say(f"ppx: warning: {msg}", sys.stderr)


def _said(e: BaseException) -> str:
    from ppx.errors import said

    return said(e)


class Writer:
    def __init__(self, init: dict):
        self.init = init
        self.run = None
        self.wandb = None
        self.failed = False  # W&B failed once: nothing more is logged
        self.kept: list[tuple[int, dict]] = []  # steps that came before W&B started
        self.last_step: int | None = None  # the run's last step: the pictures and report log there

    def start(self) -> None:
        """`wandb.init`, once (online: falling back to offline with a warning)."""
        if self.run is not None or self.failed:
            return
        # ppx prints its own W&B line; Settings(silent=True) leaves artifact uploads chatty
        os.environ.setdefault("WANDB_SILENT", "true")
        # W&B logs to its own <run>/wandb/.../debug.log (a FileHandler): one that cannot be written
        # (a full disk, a file-size limit) printed Python's "--- Logging error ---" traceback for
        # each of its lines; the write failure is ppx's own files' too, said there in one line
        logging.raiseExceptions = False
        try:
            import wandb
        except Exception as e:  # pragma: no cover - wandb is a dependency
            _warn(f"W&B unavailable ({e}); not logging to W&B")
            self.failed = True
            return
        self.wandb = wandb
        mode = self.init["mode"]
        kwargs = {k: v for k, v in self.init.items() if k != "mode"}
        # (online: W&B gives up on a server out of reach in 30 s, not 90, so that its fallback to
        # offline comes within rank 0's wait for the writer, at least 60 s; unless the user set it)
        quick = mode == "online" and "WANDB_INIT_TIMEOUT" not in os.environ
        kwargs["settings"] = wandb.Settings(silent=True, console="off", **({"init_timeout": 30.0} if quick else {}))
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as e:
            if mode == "online":
                _warn(f"W&B online failed ({_said(e)}); logging offline instead")
                try:
                    self.run = wandb.init(mode="offline", **kwargs)
                except Exception as e2:
                    _warn(f"W&B offline failed too ({_said(e2)}); not logging to W&B")
            else:
                _warn(f"W&B failed ({_said(e)}); not logging to W&B")
        if self.run is None:
            self.failed = True
            return
        kept, self.kept = self.kept, []
        for step, scalars in kept:
            self._log(step, scalars)

    def _guard(self, what: str, fn) -> None:
        if self.run is None:
            return
        try:
            fn()
        except Exception as e:
            _warn(f"W&B {what} failed ({_said(e)}); not logging to W&B any more")
            self.run, self.failed = None, True

    def _log(self, step: int, scalars: dict) -> None:
        self._guard("log", lambda: self.run.log(scalars, step=step))

    def step(self, step: int, scalars: dict) -> None:
        self.last_step = step
        if self.run is None:
            if not self.failed:
                self.kept.append((step, scalars))
            return
        self._log(step, scalars)

    def finish(self, end: dict) -> None:
        """The run's summary, its tables, pictures, report and traces, then `wandb.finish`."""
        self.start()
        if self.run is None:
            return
        wandb, run_dir = self.wandb, Path(end["run_dir"])
        at = {} if self.last_step is None else {"step": self.last_step}  # not a step after the run's last

        def final():
            self.run.summary.update(end["summary"])
            ranks = end["ranks"]
            if ranks:
                cols = sorted({k for r in ranks for k in r}, key=lambda k: (k != "rank", k))
                self.run.log({"ranks": wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in ranks])}, **at)
            pictures = {k: run_dir / f"{k}.png" for k in ("timeline", "breakdown")}
            pictures = {k: wandb.Image(str(p)) for k, p in pictures.items() if p.exists()}
            if pictures:
                self.run.log(pictures, **at)
            page = run_dir / "report.html"
            if page.exists():  # the file as it is (inject=False: no W&B stylesheet link added)
                self.run.log({"report": wandb.Html(str(page), inject=False)}, **at)
            traces = sorted((run_dir / "tb").glob("*.pt.trace.json"))  # profile.enabled: torch.profiler's
            extra = [p for p in (run_dir / "timeline.json",) if p.exists()]
            if extra or traces:
                art = wandb.Artifact(f"traces-{self.run.id}", type="profiler-traces")
                for p in traces:
                    art.add_file(str(p.resolve()), name=f"traces/{p.name}", policy="immutable")
                for p in extra:
                    art.add_file(str(p.resolve()), policy="immutable")
                self.run.log_artifact(art)
            # the runs table shows a run's summary: its step scalars there are the run's own
            # (medians, `run_scalars`), not the last step's, W&B's default, which a run that did
            # not complete keeps; set once the last step's row is committed, which sets the default
            self.run.log({}, **at, commit=True)
            self.run.summary.update(end["run_scalars"])
            mode = self.run.settings.mode
            self.run.finish()
            self.run = None
            if mode == "offline":
                offline = next(iter(sorted((run_dir / "wandb").glob("offline-run-*"))), None)
                if offline is not None:
                    _say(f"ppx: W&B offline run: {offline} (upload: wandb sync {offline})", sys.stdout)

        self._guard("finish", final)

    def abandon(self) -> None:
        """Stdin ended without ``finish`` (`_let_go` has begun the countdown): a started W&B run
        ends as failed (exit code 1); one not started never starts."""
        if self.run is not None:
            self._guard("finish", lambda: self.run.finish(exit_code=1))

    def take_cpus(self, cpus: list | None) -> None:
        """This thread (and what it starts from now on: W&B's service) on ``cpus``: the job's, as
        the steps are over. A writer whose W&B started beside the steps (online, or a long offline
        run) keeps rank 0's for what W&B started then."""
        if cpus and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:  # (the CPUs changed since: it keeps rank 0's)
                pass


def _lines(q: queue.Queue) -> None:
    """Stdin's messages into ``q`` as they come (read apart from W&B's work, so that rank 0's
    writes never wait on a full pipe while W&B imports), then None; at stdin's end without
    ``finish``, the writer let go at once (`_let_go`), whatever its main thread is doing."""
    finished = False
    try:
        for line in sys.stdin:
            if line.strip():
                msg = json.loads(line)
                finished = finished or "finish" in msg
                q.put(msg)
    except Exception:  # (a line cut off by rank 0's end; anything else: the same end)
        pass
    finally:
        if not finished:
            _let_go()
        q.put(None)


def _follow_parent(parent: int) -> None:
    """Rank 0 gone (killed alone, even after its summary: its wait for the writer gone with it):
    the writer let go (`_let_go`)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    _let_go()


def _let_go() -> None:
    """Rank 0 ended without awaiting the writer: the output goes to /dev/null (a caller reading
    ppx run's waits for no writer; the run's own lines say what happened), nothing more starts,
    and the process ends (exit code 1) within `ABANDON_S` whatever W&B is doing (starting online
    against a server out of reach, uploading)."""
    if LET_GO.is_set():
        return
    LET_GO.set()
    for stream in (sys.stdout, sys.stderr):
        stdout_to_null(stream)
    timer = threading.Timer(ABANDON_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _private_output()
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_follow_parent, args=(os.getppid(),), daemon=True).start()
    threading.Thread(target=_lines, args=(q,), daemon=True).start()
    first = q.get()
    if first is None:
        return 0
    writer = Writer(first["init"])
    if first["init"]["mode"] == "online":
        writer.start()
    while True:
        msg = q.get()
        if msg is None:
            writer.abandon()
            return 0
        if "step" in msg:
            writer.step(msg["step"], msg["scalars"])
        elif "start" in msg and not LET_GO.is_set():  # (rank 0 gone: a W&B not started never starts)
            writer.take_cpus(msg.get("cpus"))
            writer.start()
        elif "finish" in msg:
            writer.finish(msg["finish"])
            return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # (the reader thread may still wait on stdin)
