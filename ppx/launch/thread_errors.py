"""A rank's background threads that fail say so in one line, not in a traceback: a thread of
a library's own (TensorBoard's event writer, whose run directory was removed mid-run) printed
15 lines before the line naming the rank's own failure. ``PPX_TRACEBACK=1`` keeps Python's."""

from __future__ import annotations

import os
import sys
import threading

from ppx.errors import said


def one_line_thread_errors(rank: int):
    """From now on, an exception ending a thread of this process that is not ppx's own (named
    ``ppx-...``) prints ``ppx: warning: rank <r>'s thread <name> failed: <error>`` to stderr;
    the hook before it comes back."""
    before = threading.excepthook
    if os.environ.get("PPX_TRACEBACK"):  # (for ppx's developers: the whole story)
        return before

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "?"
        if args.exc_type is SystemExit or name.startswith("ppx-"):  # (ppx's own threads: a bug, its whole story)
            return before(args)
        print(f"ppx: warning: rank {rank}'s thread {name} failed: {said(args.exc_value)}", file=sys.stderr, flush=True)

    threading.excepthook = hook
    return before  # (the hook to put back: a rank run inside `ppx run` on a GPU returns to it)
