"""Enough open files for a job, before ``ppx run`` claims its run directory. A process of the
job out of file descriptors fails where it stands: torchrun's agent before it starts a rank
(``OSError: [Errno 24] Too many open files``), a rank in gloo's socket, or the rendezvous
store's connections time out for two minutes first. Measured on CPU, the most one process held
(a rank; the agent 33-63): 61 with 2 ranks, 72 with 4, 105 with 8 (W&B, the report and the
profiler on)."""

from __future__ import annotations

import resource

from ppx.errors import UserError


def needed(world: int) -> int:
    """Open files one process of a ``world``-rank job may hold, with room to spare."""
    return 96 + 16 * world


def ensure_open_files(world: int) -> None:
    """A soft RLIMIT_NOFILE below `needed` is raised to it (as Go's runtime raises its own at
    every start), inherited by the job; a hard limit below it is refused in one line."""
    need = needed(world)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        except (ValueError, OSError):  # (refused after all: said below)
            pass
    raise UserError(
        f"open files are limited to {soft} (ulimit -n; hard limit {hard}), where a {world}-rank job "
        f"needs about {need}: raise both limits to {need} or more"
    )
