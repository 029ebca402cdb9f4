"""safetensors headers, read and validated without torch.

A safetensors file is an 8-byte little-endian header length N, N bytes of a JSON object (tensor name ->
dtype, shape, data_offsets; optional `__metadata__` of string pairs), then the tensor bytes. Reading
only the header is what lets `ckpt inspect` and `ckpt verify` answer instantly on a 100 GB checkpoint,
and validating it here (the same rules the safetensors library enforces when loading) turns a
truncated or damaged shard into one clear error instead of a crash deep inside a load.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any

from ckpt_tools.errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError
from ckpt_tools.files import storage
from ckpt_tools.format.dtypes import ITEMSIZE, nbytes
from ckpt_tools.format.untrusted import describe, is_count

MAX_DIMS = 64

METADATA_KEY = "__metadata__"
# The safetensors library refuses headers above 100 MB; so do we, before allocating them.
MAX_HEADER_SIZE = 100_000_000
_LENGTH_PREFIX = 8


@dataclass(frozen=True)
class SafetensorsTensorInfo:
    """One tensor entry of a header. `data_offsets` are relative to the start of the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header: every tensor's bytes lie inside the file, back to back, without holes."""

    path: str
    header_size: int
    file_size: int
    tensors: dict[str, SafetensorsTensorInfo]
    metadata: dict[str, str]

    @property
    def data_start(self) -> int:
        """Absolute file offset of the data section (tensor offsets are relative to it)."""
        return _LENGTH_PREFIX + self.header_size

    @property
    def total_bytes(self) -> int:
        return sum(info.nbytes for info in self.tensors.values())


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Read and validate the header of a safetensors file without reading tensor data.

    Raises `CheckpointNotFoundError` for a missing file, `NotACheckpointError` when the file is not
    safetensors at all, and `CorruptCheckpointError` naming the file, the tensor and the sizes for
    a truncated or inconsistent one.
    """
    name = os.fspath(path)
    if not storage.exists(name):
        raise CheckpointNotFoundError(f"{name}: no such file")
    if storage.is_dir(name):
        raise NotACheckpointError(f"{name} is a directory, not a safetensors file")
    with storage.open_regular(name) as handle:
        file_size = storage.size(name)
        prefix = handle.read(_LENGTH_PREFIX)
        if len(prefix) < _LENGTH_PREFIX:
            raise CorruptCheckpointError(
                f"{name}: {file_size} bytes is too short for a safetensors file (needs an 8-byte "
                "header length); the file is truncated or empty, re-copy or re-save it"
            )
        (header_size,) = struct.unpack("<Q", prefix)
        _check_header_size(name, header_size, file_size)
        raw = handle.read(header_size)
    entries, metadata = _parse_header_json(name, raw)
    tensors = {key: _tensor_info(name, key, value) for key, value in entries.items()}
    _check_layout(name, tensors, _LENGTH_PREFIX + header_size, file_size)
    return SafetensorsHeader(
        path=name, header_size=header_size, file_size=file_size, tensors=tensors, metadata=metadata
    )


def _check_header_size(name: str, header_size: int, file_size: int) -> None:
    if header_size > MAX_HEADER_SIZE:
        raise NotACheckpointError(
            f"{name}: header length {header_size} exceeds the safetensors limit of {MAX_HEADER_SIZE} "
            "bytes; this is not a safetensors file"
        )
    if _LENGTH_PREFIX + header_size > file_size:
        raise CorruptCheckpointError(
            f"{name}: truncated: the header needs {_LENGTH_PREFIX + header_size} bytes but the file has "
            f"{file_size}; re-copy or re-save the file"
        )


def _parse_header_json(name: str, raw: bytes) -> tuple[dict[str, Any], dict[str, str]]:
    if not raw.startswith(b"{"):
        raise NotACheckpointError(f"{name}: the header is not a JSON object; this is not a safetensors file")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=lambda pairs: _no_duplicates(name, pairs))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(
            f"{name}: the header is not valid JSON ({exc}); the file is damaged"
        ) from None
    except RecursionError:
        raise CorruptCheckpointError(
            f"{name}: the header nests JSON too deeply; the file is damaged"
        ) from None
    except ValueError as exc:  # an integer over Python's 4300-digit conversion limit
        raise CorruptCheckpointError(f"{name}: the header holds a value out of range ({exc})") from None
    metadata = data.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise CorruptCheckpointError(f"{name}: {METADATA_KEY} must map strings to strings")
    return data, metadata


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_duplicates(name: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if not key.isascii() and not _is_text(key):
            raise CorruptCheckpointError(
                f"{name}: the header holds the name {describe(key)}, which is not valid text (a lone "
                "surrogate); the file is damaged"
            )
        if key in out:
            raise CorruptCheckpointError(
                f"{name}: the header lists {describe(key)} twice; the file is damaged"
            )
        out[key] = value
    return out


def _tensor_info(name: str, key: str, value: Any) -> SafetensorsTensorInfo:
    where = f"{name}: tensor {describe(key)}"
    if not isinstance(value, dict):
        raise CorruptCheckpointError(f"{where}: expected an object with dtype, shape, data_offsets")
    dtype = value.get("dtype")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise CorruptCheckpointError(
            f"{where}: unknown dtype {describe(dtype)} (known: {', '.join(ITEMSIZE)}); "
            "written by a newer safetensors, or damaged"
        )
    shape = value.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(is_count(dim) for dim in shape):
        raise CorruptCheckpointError(
            f"{where}: shape {describe(shape)} is not a list of non-negative integers (at most {MAX_DIMS})"
        )
    offsets = value.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_count(o) for o in offsets)):
        raise CorruptCheckpointError(
            f"{where}: data_offsets {describe(offsets)} is not a pair of non-negative integers"
        )
    info = SafetensorsTensorInfo(key, dtype, tuple(shape), (offsets[0], offsets[1]))
    expected = nbytes(dtype, info.shape)
    if info.nbytes != expected:
        raise CorruptCheckpointError(
            f"{where}: data_offsets {offsets} span {info.nbytes} bytes but {dtype}{list(shape)} needs "
            f"{expected}; the file is damaged"
        )
    return info


def _check_layout(
    name: str, tensors: dict[str, SafetensorsTensorInfo], data_start: int, file_size: int
) -> None:
    """Tensors must tile the data section exactly: start at 0, no holes, no overlaps, end at EOF."""
    data_size = file_size - data_start
    position = 0
    for info in sorted(tensors.values(), key=lambda t: (t.data_offsets, t.name)):
        begin, end = info.data_offsets
        if begin != position:
            kind = "overlaps the previous tensor" if begin < position else f"leaves a hole at byte {position}"
            raise CorruptCheckpointError(
                f"{name}: tensor {describe(info.name)} at data offset {begin} {kind}"
            )
        position = end
    if position > data_size:
        raise CorruptCheckpointError(
            f"{name}: truncated: the header describes {position} bytes of tensor data, so the file should "
            f"have {data_start + position} bytes, but it has {data_start + data_size}; re-copy or re-save it"
        )
    if position < data_size:
        raise CorruptCheckpointError(
            f"{name}: {data_size - position} trailing bytes after the last tensor; the file is damaged"
        )
