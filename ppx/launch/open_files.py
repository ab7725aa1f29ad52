"""Enough open files for a job, before ``ppx run`` claims its run directory. A process of the
job out of file descriptors fails where it stands: torchrun's agent before it starts a rank
(``OSError: [Errno 24] Too many open files``), a rank in gloo's socket, or the rendezvous
store's connections time out for two minutes first. Measured on CPU, the most one process held
(a rank; the agent 33-63): 61 with 2 ranks, 72 with 4, 105 with 8 (W&B, the report and the
profiler on)."""

from __future__ import annotations

import resource
import sys

from ppx.errors import UserError

FLOOR = 64  # below this a 2-rank CPU job failed (48 failed, 64 ran): refused whatever the job


def needed(world: int) -> int:
    """Open files one process of a ``world``-rank job may hold, with room to spare (measured on
    CPU only: a GPU's rank also holds the device's and NCCL's)."""
    return 96 + 16 * world


def ensure_open_files(world: int) -> None:
    """A soft RLIMIT_NOFILE below `needed` is raised to it (as Go's runtime raises its own at
    every start), inherited by the job; where the hard limit is below that, to the hard limit,
    with a warning (the estimate is a line through three jobs' counts, not a law), and a hard
    limit below `FLOOR` is refused in one line."""
    need = needed(world)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FLOOR:  # (a soft limit up to the need has a hard one past FLOOR)
        raise UserError(
            f"open files are limited to {soft} (ulimit -n; hard limit {hard}), where a {world}-rank job "
            f"needs about {need}: raise both limits to {need} or more"
        )
    to = raise_soft_limit(need)
    if to < need:
        print(
            f"ppx: warning: open files are limited to {to} (ulimit -n, hard limit {hard}), where a {world}-rank "
            f"job may need about {need}; should a process run out, raise the hard limit",
            file=sys.stderr,
        )


def raise_soft_limit(need: int) -> int:
    """The soft RLIMIT_NOFILE raised to ``need``, or as near as the hard limit lets it (never
    lowered); the soft limit now (`RLIM_INFINITY` counted as ``need``). torchrun's agent under
    srun, which no ``ppx run`` checked, calls it with its own ranks' need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return need if soft == resource.RLIM_INFINITY else soft
    to = need if hard == resource.RLIM_INFINITY or hard >= need else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (to, hard))
        return to
    except (ValueError, OSError):
        return soft
