"""A CPU run's worker, forked by torchrun from its agent (``--run-path`` with
``--start-method=fork``): `ppx.launch.torchrun` has imported torch, ``torch._dynamo`` and the
worker's modules there once, so a rank starts without importing them again (docs/running.md).

A forked worker differs from a started one in what it inherits, and this file puts that back:

- the agent's signal handlers, which turn SIGTERM into torchrun's SignalException: a worker
  takes the default actions again (SIGTERM ends it; SIGINT raises KeyboardInterrupt);
- torchrun's way of ending a forked worker: it returns from this script when its rank
  succeeded (torchrun waits for every rank's return), and exits with its rank's code
  otherwise.

CUDA runs keep ``python -m ppx.launch.worker``: a process that has touched CUDA cannot fork.
"""

from __future__ import annotations

import signal
import sys

from ppx.launch.worker import main

if __name__ == "__main__":  # runpy.run_path(..., run_name="__main__"), in the forked child
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)
