"""A DCP checkpoint directory as a chunk table, read without torch.

torch's DCP writes one `.metadata` pickle (every tensor's shape, dtype and saved chunks, and where each
chunk lies: file, offset, length) plus `.distcp` files holding the chunks. This module turns the
metadata into plain frozen dataclasses through the restricted unpickler, so `ckpt inspect` answers
without importing torch. Which tensors are model weights and which optimizer state is `roles.py`;
where a chunk's raw element bytes lie inside its `torch.save` record is `records.py`.

The metadata is untrusted (see `untrusted`): `.metadata` is read only as a regular file under a size
limit, every field is type- and range-checked into the dataclasses below (one line naming the entry
otherwise), and every `relative_path` must name a file inside the DCP directory, so no record can make
a reader copy bytes from elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ckpt_tools.dcp.safe_pickle import (
    MAX_DIMS,
    BytesStorageMetadata,
    Metadata,
    TensorStorageMetadata,
    restricted_loads,
)
from ckpt_tools.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    Finding,
    NotACheckpointError,
)
from ckpt_tools.files import storage
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import nbytes, safetensors_code
from ckpt_tools.format.untrusted import MAX_METADATA_BYTES, describe, is_count


@dataclass(frozen=True)
class ChunkEntry:
    """One saved piece of a tensor: its box in the full tensor and its record in a `.distcp` file.

    `file_offset`/`length` delimit the whole record (a torch.save archive, or raw bytes when
    `length` equals the chunk's byte count); `transforms` lists DCP storage transforms (compression
    extensions), empty for plain records.
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    file_offset: int
    length: int
    transforms: tuple[str, ...] = ()

    @property
    def numel(self) -> int:
        return _numel(self.sizes)


@dataclass(frozen=True)
class TensorEntry:
    """A tensor of the checkpoint: full shape, safetensors dtype code and its chunks."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[ChunkEntry, ...]

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)


@dataclass(frozen=True)
class ObjectEntry:
    """A non-tensor item (torch stores it as pickled bytes): listed, never unpickled here."""

    name: str
    file: str
    file_offset: int
    length: int


@dataclass(frozen=True)
class DcpIndex:
    """The chunk table of one DCP directory.

    `paths` maps each flattened key to its path in the nested state dict that was saved (DCP's
    planner data): `("model", "encoder.weight")` for a key saved under a `{"model": ...}` wrapper.
    """

    path: str
    tensors: dict[str, TensorEntry]
    objects: dict[str, ObjectEntry]
    paths: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(entry.nbytes for entry in self.tensors.values())


def read_dcp_index(path: str | os.PathLike[str], *, check_files: bool = True) -> DcpIndex:
    """Read a DCP directory's `.metadata` into a chunk table; never reads tensor data.

    Raises CheckpointNotFoundError (no such path), NotACheckpointError (no `.metadata`),
    CorruptCheckpointError (bad pickle, or with `check_files` the first missing or truncated `.distcp`
    file) and UnsafePickleError (the pickle names a class outside DCP's metadata classes). `ckpt verify`
    passes `check_files=False` and lists every bad file with `dcp_file_problems`.
    """
    root = os.fspath(path).rstrip("/")
    if not storage.exists(root):
        raise CheckpointNotFoundError(f"{root}: no such file or directory")
    if not storage.is_dir(root) or not storage.exists(layout.join(root, layout.DCP_METADATA)):
        raise NotACheckpointError(
            f"{root} has no {layout.DCP_METADATA} file: not a DCP checkpoint directory "
            "(pass the directory torch.distributed.checkpoint saved into)"
        )
    what = f"{root}/{layout.DCP_METADATA}"
    data = storage.read_bytes(what, MAX_METADATA_BYTES)
    metadata = restricted_loads(data, what=what)
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CorruptCheckpointError(f"{root}/{layout.DCP_METADATA} does not hold DCP Metadata")
    index = _build_index(root, metadata)
    problems = dcp_file_problems(index) if check_files else []
    if problems:
        raise CorruptCheckpointError(problems[0].message)
    return index


def _build_index(root: str, metadata: Metadata) -> DcpIndex:
    locations = _storage_locations(root, metadata.storage_data)
    tensors: dict[str, TensorEntry] = {}
    objects: dict[str, ObjectEntry] = {}
    for name, item in metadata.state_dict_metadata.items():
        if not isinstance(name, str):
            raise CorruptCheckpointError(f"{root}: .metadata has an entry named by {describe(name)}")
        if isinstance(item, TensorStorageMetadata):
            tensors[name] = _tensor_entry(root, name, item, locations)
        elif isinstance(item, BytesStorageMetadata):
            record = _location(root, locations, name, None)
            objects[name] = ObjectEntry(name, record.file, record.offset, record.length)
        else:
            raise CorruptCheckpointError(f"{root}: entry {name!r} has an unknown metadata type")
    return DcpIndex(root, tensors, objects, _planner_paths(metadata.planner_data))


def _planner_paths(planner: Any) -> dict[str, tuple[str, ...]]:
    """Keys saved under a nested state dict and their path in it (components are names or indices)."""
    if not isinstance(planner, dict):
        return {}
    return {
        key: tuple(str(p) for p in value)
        for key, value in planner.items()
        if isinstance(key, str)
        and isinstance(value, tuple)
        and all(isinstance(p, str) or is_count(p) for p in value)
    }


@dataclass(frozen=True)
class _StorageRecord:
    """A validated storage record: `file` is a name inside the DCP directory."""

    file: str
    offset: int
    length: int
    transforms: tuple[str, ...]


_Locations = dict[tuple[str, "tuple[int, ...] | None"], Any]


def _storage_locations(root: str, storage_data: Any) -> _Locations:
    if not isinstance(storage_data, dict):
        raise CorruptCheckpointError(f"{root}/{layout.DCP_METADATA} has no storage table")
    table: _Locations = {}
    for key, info in storage_data.items():
        fqn, offset = getattr(key, "fqn", None), getattr(key, "offset", None)
        if not isinstance(fqn, str):
            raise CorruptCheckpointError(f"{root}: a storage record is keyed by {describe(fqn)}, not a name")
        table[(fqn, None if offset is None else _dims(root, fqn, "offset", offset))] = info
    return table


def _dims(root: str, name: str, field_name: str, value: Any) -> tuple[int, ...]:
    """A shape, offset or size tuple: at most MAX_DIMS non-negative int64 values."""
    if not isinstance(value, tuple) or len(value) > MAX_DIMS or not all(is_count(x) for x in value):
        raise CorruptCheckpointError(
            f"{root}: {name!r} has {field_name} {describe(value)}, not a tuple of non-negative integers"
        )
    return value


def _location(root: str, table: _Locations, name: str, offsets: tuple[int, ...] | None) -> _StorageRecord:
    info = table.get((name, offsets))
    where = "" if offsets is None else f" chunk at {list(offsets)}"
    if info is None or info.relative_path is None or info.offset is None or info.length is None:
        raise CorruptCheckpointError(f"{root}: {name!r}{where} has no storage record in .metadata")
    if not is_count(info.offset) or not is_count(info.length) or not is_count(info.offset + info.length):
        raise CorruptCheckpointError(
            f"{root}: {name!r}{where} has a storage record at offset {describe(info.offset)} of length "
            f"{describe(info.length)}, not a byte range a file can hold"
        )
    transforms = info.transform_descriptors or ()
    if not isinstance(transforms, (list, tuple)) or not all(isinstance(t, str) for t in transforms):
        raise CorruptCheckpointError(f"{root}: {name!r}{where} has transforms {describe(transforms)}")
    storage.contained(root, info.relative_path, f"the record of {name!r}{where}")
    return _StorageRecord(info.relative_path, info.offset, info.length, tuple(str(t) for t in transforms))


def _tensor_entry(root: str, name: str, item: TensorStorageMetadata, table: _Locations) -> TensorEntry:
    dtype_name = getattr(item.properties, "dtype", None)
    try:
        dtype = safetensors_code(dtype_name) if isinstance(dtype_name, str) else ""
    except ValueError:
        dtype = ""
    if not dtype:
        raise CorruptCheckpointError(
            f"{root}: tensor {name!r} has dtype {describe(dtype_name)}, which safetensors cannot hold"
        )
    shape = _dims(root, name, "shape", item.size)
    if not is_count(_numel(shape)):
        raise CorruptCheckpointError(f"{root}: tensor {name!r} has {len(shape)} dimensions too large to hold")
    chunks = item.chunks or ()
    if not isinstance(chunks, (list, tuple)):
        raise CorruptCheckpointError(f"{root}: tensor {name!r} has chunks {describe(chunks)}, not a list")
    entries = []
    for chunk in chunks:
        offsets = _dims(root, name, "a chunk offset", getattr(chunk, "offsets", None))
        sizes = _dims(root, name, "a chunk size", getattr(chunk, "sizes", None))
        record = _location(root, table, name, offsets)
        entries.append(
            ChunkEntry(offsets, sizes, record.file, record.offset, record.length, record.transforms)
        )
    return TensorEntry(name, shape, dtype, tuple(entries))


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def dcp_file_problems(index: DcpIndex) -> list[Finding]:
    """One finding per referenced `.distcp` file that is missing or shorter than its furthest record."""
    needed: dict[str, int] = {}
    records = [(c.file, c.file_offset + c.length) for t in index.tensors.values() for c in t.chunks]
    records += [(o.file, o.file_offset + o.length) for o in index.objects.values()]
    for file, end in records:
        needed[file] = max(needed.get(file, 0), end)
    listed = storage.list_files(index.path)
    sizes = {name: size for name, size in listed.items() if size is not None}
    problems = []
    for file, end in sorted(needed.items()):
        path = f"{index.path}/{file}"
        if file in listed and file not in sizes:
            problems.append(Finding(path, f"{path} is not a regular file: refused; .metadata references it"))
            continue
        if file not in sizes and storage.is_file(path):  # a record in a subdirectory
            sizes[file] = storage.size(path)
        if file not in sizes:
            problems.append(Finding(path, f"{path} is missing; .metadata references it"))
        elif sizes[file] < end:
            problems.append(
                Finding(
                    path,
                    f"{path} is truncated: {sizes[file]} bytes, .metadata needs {end}; "
                    "the save was interrupted, use another checkpoint",
                )
            )
    return problems
