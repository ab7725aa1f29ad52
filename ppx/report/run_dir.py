"""The files of a run directory, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
