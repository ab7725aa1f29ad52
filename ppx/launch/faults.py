"""Fault injection for testing the failure path (``runtime.inject_fault``).

``hang@1F2`` makes the rank owning stage 1 stop answering when it reaches action 1F2;
``die@1F2`` makes it die there (SIGKILL). The watchdog and the launcher must then end the
job with a message naming the rank and the action.
"""

from __future__ import annotations

import os
import signal
import time

from ppx.config.fault_spec import parse_fault


class FaultInjector:
    """Observer that hangs or kills this process when it reaches the target action."""

    def __init__(self, spec: str):
        self.kind, self.action = parse_fault(spec)

    def before(self, item) -> None:
        if item.kind == "compute" and item.actions[0] == self.action:
            if self.kind == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # hang: stop answering, as a deadlocked or stuck rank would
                time.sleep(3600)

    def after(self, item) -> None:
        pass
