"""Where a DCP chunk's raw element bytes lie inside its `.distcp` record (a `torch.save` zip archive),
so conversion copies them by offset instead of loading tensors. The record is untrusted: its zip
headers, its `data.pkl` (through the restricted unpickler) and the byte ranges are all checked, and a
record the offset reader does not handle (transposed, strided, another dtype) is left to torch.
"""

from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass
from typing import IO

from ckpt_tools.dcp.index import ChunkEntry, DcpIndex
from ckpt_tools.dcp.safe_pickle import (
    load_tensor_record,
)
from ckpt_tools.errors import (
    CheckpointError,
    CorruptCheckpointError,
    Finding,
    UnsafePickleError,
    one_line,
)
from ckpt_tools.files import storage
from ckpt_tools.format.dtypes import ITEMSIZE, SAFETENSORS_TO_TORCH
from ckpt_tools.format.untrusted import describe

_MAX_RECORD_PICKLE = 1 << 20
"""A chunk record's `data.pkl` names one tensor in a few hundred bytes."""

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"
# What zipfile and struct raise on a record whose bytes are damaged (a truncated or altered archive).
_DAMAGED_RECORD = (zipfile.BadZipFile, EOFError, struct.error, ValueError, OverflowError, NotImplementedError)


def _damaged(where: str, exc: Exception) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{where}: chunk record is damaged ({str(exc)[:200]})")


@dataclass(frozen=True)
class ChunkData:
    """Where a chunk's element bytes lie in its file: C-contiguous, little-endian, `length` bytes."""

    offset: int
    length: int


def locate_chunk_data(handle: IO[bytes], chunk: ChunkEntry, dtype: str, where: str) -> ChunkData | None:
    """Find the raw bytes of `chunk` inside its open `.distcp` file, reading only small headers.

    Returns None when the record is not a plain contiguous tensor of the expected dtype (a transform,
    a non-contiguous view, a tensor subclass): the caller then loads that chunk with torch.
    Raises CorruptCheckpointError when the record is damaged.
    """
    want = chunk.numel * ITEMSIZE[dtype]
    if chunk.transforms:
        return None
    if chunk.length == want:  # a raw (non torch.save) record
        return ChunkData(chunk.file_offset, want)
    try:
        with zipfile.ZipFile(_Slice(handle, chunk.file_offset, chunk.length)) as archive:
            return _locate_in_archive(archive, handle, chunk, dtype, want, where)
    except _DAMAGED_RECORD as exc:
        raise _damaged(where, exc) from None


def _locate_in_archive(
    archive: zipfile.ZipFile, handle: IO[bytes], chunk: ChunkEntry, dtype: str, want: int, where: str
) -> ChunkData | None:
    names = {info.filename.split("/", 1)[-1]: info for info in archive.infolist()}
    stored = zipfile.ZIP_STORED
    compressed = next((info.filename for info in names.values() if info.compress_type != stored), None)
    if compressed is not None:
        raise CorruptCheckpointError(
            f"{where}: chunk record entry {describe(compressed)} is compressed; torch.save stores records "
            "uncompressed, so this one is refused rather than inflated"
        )
    pickled = names.get("data.pkl")
    byteorder = names.get("byteorder")
    if pickled is None:
        raise CorruptCheckpointError(f"{where}: chunk record has no data.pkl")
    if pickled.file_size > _MAX_RECORD_PICKLE or (byteorder is not None and byteorder.file_size > 64):
        raise CorruptCheckpointError(f"{where}: chunk record's data.pkl is larger than a tensor record")
    if byteorder is not None and archive.read(byteorder).strip() != b"little":
        return None
    try:
        record = load_tensor_record(archive.read(pickled), what=f"{where} (tensor record)")
    except UnsafePickleError:
        return None
    info = names.get(f"data/{record.storage.key}")
    itemsize = ITEMSIZE[dtype]
    if (
        info is None
        or record.storage.dtype != SAFETENSORS_TO_TORCH[dtype]
        or record.shape != chunk.sizes
        or not _is_contiguous(record.shape, record.stride)
        or (record.storage_offset + chunk.numel) * itemsize > info.file_size
    ):
        return None
    handle.seek(chunk.file_offset + info.header_offset)
    magic, *_rest, name_len, extra_len = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
    if magic != _LOCAL_MAGIC:
        raise CorruptCheckpointError(f"{where}: chunk record has a bad zip entry header")
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    return ChunkData(chunk.file_offset + start + record.storage_offset * itemsize, want)


def dcp_record_problems(index: DcpIndex) -> list[Finding]:
    """One finding per damaged chunk record (at most one per file, keyed by that file): each record's zip structure, as
    conversion reads it (`locate_chunk_data`), and the CRC-32 of every entry it holds, read through
    in blocks. `verify --deep` runs it where no manifest hashes the files (a bare DCP directory), so a
    flipped byte there is found before `ckpt convert` copies it."""
    problems: dict[str, str] = {}
    for entry in index.tensors.values():
        for chunk in entry.chunks:
            if chunk.file in problems:
                continue
            where = f"{index.path}/{chunk.file} (a chunk of {describe(entry.name)})"
            try:
                with storage.open_regular(
                    storage.contained(index.path, chunk.file, "a chunk record")
                ) as handle:
                    _check_record(handle, chunk, entry.dtype, where)
            except CheckpointError as exc:
                problems[chunk.file] = one_line(exc)
    return [Finding(f"{index.path}/{file}", problems[file]) for file in sorted(problems)]


def _check_record(handle: IO[bytes], chunk: ChunkEntry, dtype: str, where: str) -> None:
    locate_chunk_data(handle, chunk, dtype, where)  # the structure, as conversion checks it
    if chunk.transforms or chunk.length == chunk.numel * ITEMSIZE[dtype]:
        return  # a raw record (or one left to torch's transforms): no CRC-32 to check
    try:
        with zipfile.ZipFile(_Slice(handle, chunk.file_offset, chunk.length)) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:  # zipfile checks the CRC-32 at the end of each entry
                    while member.read(_CRC_BLOCK):
                        pass
    except _DAMAGED_RECORD as exc:
        raise _damaged(where, exc) from None


_CRC_BLOCK = 1 << 20


def _is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for dim, step in zip(reversed(shape), reversed(stride), strict=True):
        if dim != 1 and step != expected:
            return False
        expected *= dim
    return True


class _Slice:
    """A read-only, seekable window [start, start+length) of an open file, for zipfile."""

    def __init__(self, handle: IO[bytes], start: int, length: int) -> None:
        self._handle, self._start, self._length, self._pos = handle, start, length, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        left = max(0, self._length - self._pos)
        size = left if size is None or size < 0 else min(size, left)
        self._handle.seek(self._start + self._pos)
        data = self._handle.read(size)
        self._pos += len(data)
        return data
