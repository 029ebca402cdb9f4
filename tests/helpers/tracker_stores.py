"""Read what the experiment trackers wrote locally: W&B offline run directories and trackio's store."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of (crc, length, type) records
_HEADER = 7


@dataclass
class WandbRun:
    """One offline run directory (a resumed run writes a second directory with the same id)."""

    run_id: str
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def wandb_offline_runs(output_dir: Path) -> list[WandbRun]:
    """Every offline run under `output_dir/wandb`, oldest first."""
    return [_read_run(path) for path in sorted((output_dir / "wandb").glob("offline-run-*/run-*.wandb"))]


def _read_run(path: Path) -> WandbRun:
    run = WandbRun(run_id="")
    for record in _records(path.read_bytes()):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
    return run


def _items(items: Any) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def _records(data: bytes) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    assert data[:4] == b":W&B", "not a W&B run file"
    pos, chunks = _HEADER, []
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if (kind, length) == (0, 0):
            break
        chunks.append(data[pos + _HEADER : pos + _HEADER + length])
        pos += _HEADER + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def trackio_logs(project: str, run: str) -> list[dict[str, Any]]:
    """The metrics rows trackio stored locally for `run` (each with its step)."""
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run)


def trackio_config(project: str, run: str) -> dict[str, Any]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_run_config(project, run) or {}
