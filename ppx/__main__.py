"""``python -m ppx``: the ``ppx`` command, as its console script runs it (the same exit code)."""

import sys

from ppx.cli import main

if __name__ == "__main__":
    sys.exit(main())
