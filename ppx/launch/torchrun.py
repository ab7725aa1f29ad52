"""torchrun (``torch.distributed.run``), minus the Python traceback it prints when a worker
fails: ``ppx run`` follows a failed job with its own line naming each rank and the action it
was on, and the workers have already printed theirs. Exit codes are torchrun's."""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main


def main(argv: list[str]) -> int:
    try:
        torchrun_main(argv)
    except ChildFailedError as e:
        failures = sorted(e.failures.items())
        lines = [
            f"rank {rank}: exit code {f.exitcode}" + (f" ({f.signal_name()})" if f.exitcode < 0 else "")
            for rank, f in failures
        ]
        print(f"torchrun: {e.name} failed: " + "; ".join(lines), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
