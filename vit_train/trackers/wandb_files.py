"""Reading W&B's own run files (`run-<id>.wandb` under `wandb/offline-run-*` or `wandb/run-*`) back without a server.

wandb 0.31 has no public reader of these files (the Python `DataStore` of earlier releases is gone; `wandb sync`
and `wandb beta leet` read them in its Go core). The file is W&B's transaction log: a 7-byte header (":W&B",
magic 0xBEE1, version) then LevelDB's log format (32 KiB blocks of records, each with a CRC-32, its length and
whether it is a whole record or the first, a middle or the last piece of one), and every record is W&B's own
protobuf `wandb.proto.wandb_internal_pb2.Record`, parsed here with wandb's classes. A record whose CRC does not
match (a torn write at a kill) is skipped with the rest of its block, as LevelDB's reader does.

W&B's core process writes a block when it is full or the run finishes: a process killed outright (SIGKILL, OOM,
a lost node) leaves up to 32 KiB of the last rows unwritten, so what these files hold is what a resume re-sends.
"""

from __future__ import annotations

import glob
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<4sHB")  # ident, magic, version
IDENT, MAGIC = b":W&B", 0xBEE1
CHUNK = struct.Struct("<IHB")  # crc32 of (type byte + data), data length, type
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def run_files(folder: Path, tracker_id: str) -> list[Path]:
    """The transaction logs of W&B run `tracker_id` under `folder` (a `wandb/` directory), one per attempt,
    oldest first. An attempt's folder is `offline-run-<YYYYMMDD_HHMMSS>-<id>` (`run-...` online), with `-1`, `-2`
    ... added when an earlier attempt started in the same second; `latest-run` is a link and left out."""
    name = re.compile(rf"(?:offline-)?run-(\d{{8}}_\d{{6}})-{re.escape(tracker_id)}(?:-(\d+))?")
    found = []
    for path in folder.glob(f"*run-*-{glob.escape(tracker_id)}*/run-{glob.escape(tracker_id)}.wandb"):
        match = name.fullmatch(path.parent.name)
        if match and not path.parent.is_symlink():
            found.append(((match[1], int(match[2] or 0)), path))
    return [path for _, path in sorted(found)]


def payloads(path: Path) -> Iterator[bytes]:
    """Each whole record's bytes in file order; raises ValueError when the file is not a W&B transaction log."""
    data = path.read_bytes()
    if len(data) < HEADER.size or HEADER.unpack_from(data)[:2] != (IDENT, MAGIC):
        raise ValueError(f"{path} is not a W&B run file (no ':W&B' header)")
    pos, pieces = HEADER.size, b""
    while pos + CHUNK.size <= len(data):
        block_left = BLOCK - pos % BLOCK
        if block_left < CHUNK.size:  # the block's trailer: zeros
            pos += block_left
            continue
        crc, length, kind = CHUNK.unpack_from(data, pos)
        body = data[pos + CHUNK.size : pos + CHUNK.size + length]
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += block_left
            continue
        if len(body) < length or zlib.crc32(body, zlib.crc32(bytes((kind,)))) != crc:
            pos += block_left  # torn or damaged: skip the rest of this block, as LevelDB's reader does
            pieces = b""
            continue
        pos += CHUNK.size + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pieces = body
        elif kind == MIDDLE:
            pieces += body
        elif kind == LAST:
            yield pieces + body
            pieces = b""


def records(path: Path) -> Iterator[Any]:
    """Each record of a W&B run file as wandb's protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    for payload in payloads(path):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(payload)
        yield record


def history(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, {key: value}) of each history row in a W&B run file; W&B's own keys (`_step`, `_runtime`, ...) left out."""
    import json

    for record in records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                row[key] = json.loads(item.value_json)
        yield record.history.step.num, row
