"""Read back a W&B run file (``run-<id>.wandb``): the honest check of what was logged.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, 2 magic bytes, a version byte),
then 32 KiB blocks of chunks, each with a header of crc32 (4 bytes), length (2, little
endian) and type (1: full, 2: first, 3: middle, 4: last), holding serialized
``wandb_internal_pb2.Record`` protobufs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


def records(path: str | Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    out, pending, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind in (1, 2):
            pending = chunk
        else:
            pending += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
    return out


def history(path: str | Path) -> list[dict]:
    """The logged history rows, as {key: value}."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            )
    return rows


def summary(path: str | Path) -> dict:
    out = {}
    for rec in records(path):
        if rec.WhichOneof("record_type") == "summary":
            for item in rec.summary.update:
                out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def run_info(path: str | Path) -> dict:
    for rec in records(path):
        if rec.WhichOneof("record_type") == "run":
            return {
                "project": rec.run.project,
                "group": rec.run.run_group,
                "name": rec.run.display_name,
                "config": {i.key: json.loads(i.value_json) for i in rec.run.config.update},
                "start_time_s": rec.run.start_time.seconds + rec.run.start_time.nanos / 1e9,
            }
    return {}


def exit_code(path: str | Path) -> int | None:
    """The exit code the run ended with (its exit record), or None where it has none."""
    ends = [rec.exit for rec in records(path) if rec.WhichOneof("record_type") == "exit"]
    return ends[-1].exit_code if ends else None
