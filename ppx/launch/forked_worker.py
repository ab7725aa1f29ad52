"""A CPU run's worker, forked by torchrun from its agent (``--run-path`` with
``--start-method=fork``): `ppx.launch.torchrun` has imported torch, ``torch._dynamo`` and the
worker's modules there once, so a rank starts without importing them again (docs/running.md).

A forked worker differs from a started one in what it inherits, and this file puts that back:

- the agent's signal handlers, which turn SIGTERM (and whatever else torchrun handles) into
  torchrun's SignalException: the rank takes the default actions again (SIGTERM ends it;
  SIGINT raises KeyboardInterrupt, and a KeyboardInterrupt that reaches here ends the rank
  by SIGINT, as it ends a started Python, not with the 0 torch's fork wrapper would give);
- how a rank ends: it returns from this script when it succeeded (torchrun waits for every
  rank's return), and otherwise exits with its code at once, an error that escaped the
  worker printed with its traceback (torch's fork wrapper would keep it in a file nobody
  reads).

CUDA runs keep ``python -m ppx.launch.worker``: a process that has touched CUDA cannot fork.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

from ppx.launch.stops import WARNINGS
from ppx.launch.worker import main


def _default_signals() -> None:
    """Each signal torchrun's agent handles back to what a new Python has (ppx's wrapper
    handles SIGUSR1 and SIGUSR2 too: `ppx.launch.stops.WARNINGS`)."""
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) is _terminate_process_handler or sig in WARNINGS:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):
            continue


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def _end(code: int) -> None:
    _flush()
    os._exit(code)  # as worker.py's own end: no interpreter teardown


if __name__ == "__main__":  # runpy.run_path(..., run_name="__main__"), in the forked child
    _default_signals()
    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        _end(128 + signal.SIGINT)  # not reached
    except Exception:
        traceback.print_exc()
        _end(1)
    if code:
        _end(code)
    _flush()  # and return: torchrun waits for each rank's return
