"""The simulator's two transports: when a posted send or receive completes.

``nccl`` is the strict one: each run of consecutive comm actions is one batch, a rank's
batches complete in order (one stream), an op completes only once the peer's matching op
sits in that peer's active batch, and a compute action waits for the whole batch that
receives its input. A list that passes here also passes on gloo, which is looser.
``gloo`` is how ppx's runtime runs on gloo: every send and receive completes on its own,
``p2p`` after both ends are posted, receives may be posted ``recv_lookahead`` compute
actions early (`receive_early`), and a compute action waits only for its own input.

Both run the same compiled programs (`ppx.schedules.sim.compiled`); their rules are the two
event-driven loops of `ppx.schedules.sim.simcore` (`run_nccl`, `run_gloo`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppx.errors import ScheduleError
from ppx.schedules.sim.simcore import run_gloo, run_nccl


@dataclass(frozen=True)
class Transport:
    """One transport's rules: ``run`` (compiled program, costs...) -> the run's state."""

    name: str
    run: Callable
    in_order: bool  # a rank's batches complete in order, one stream (nccl)
    takes_lookahead: bool  # whether receives may be posted early (`receive_early`)


TRANSPORTS: dict[str, Transport] = {
    "nccl": Transport("nccl", run_nccl, in_order=True, takes_lookahead=False),
    "gloo": Transport("gloo", run_gloo, in_order=False, takes_lookahead=True),
}


def transport_class(name: str) -> Transport:
    """The transport called ``name``; ScheduleError for an unknown one."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise ScheduleError(f"unknown transport {name!r}; choose nccl or gloo") from None
