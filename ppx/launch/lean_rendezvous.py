"""torch's c10d rendezvous without two fixed costs it adds to every job's start and end, about
0.7 s of a short CPU run here (2 s):

- each event it records names the method that records it with ``inspect.stack()`` (twice),
  which reads the source of every frame on the stack: 40-130 ms a call, nine calls a job (six
  before the first rank starts, three after the last ends), though the event goes nowhere
  unless a handler is set. The name is now read from the frame itself, the same name;
- a node's first join waits a random 0-0.3 s, to spread many nodes' first requests to the
  store: a job of one node (``--standalone``, ``--nnodes=1``: every ``ppx run``) has no other
  node to spread from, and now joins at once. A job over several nodes (``slurm/pp.sbatch``)
  keeps the wait.

Where torch no longer has what is replaced, its own is left as it is."""

from __future__ import annotations

import contextlib
import io
import sys


def apply(argv: list[str]) -> None:
    """Both, for the torchrun job of ``argv`` (torchrun's arguments), in this process."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:
        return
    if callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        dynamic_rendezvous.get_method_name = _method_name
    delay = getattr(dynamic_rendezvous, "_delay", None)
    if callable(delay) and _one_node(argv):
        dynamic_rendezvous._delay = _no_spread(delay)


def _method_name(depth: int = 2) -> str:
    """``inspect.stack()[depth].function`` (torch's `get_method_name`), without reading every
    frame's source."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # (a stack not that deep)
        return "no_method_name"


def _no_spread(delay):
    """torch's ``_delay``, but for a random wait (a ``(low, high)`` range): the spread of a
    node's first join among many nodes."""

    def wait(seconds):
        if isinstance(seconds, tuple):
            return None
        return delay(seconds)

    return wait


def _one_node(argv: list[str]) -> bool:
    """Whether torchrun's ``argv`` starts a job of one node; False where they do not parse
    (torchrun says why itself)."""
    try:
        from torch.distributed.run import parse_args, parse_min_max_nnodes

        with contextlib.redirect_stderr(io.StringIO()):  # (argparse's message: torchrun's own says it)
            args = parse_args(argv)
        return bool(args.standalone) or parse_min_max_nnodes(args.nnodes)[1] == 1
    except (SystemExit, Exception):
        return False
