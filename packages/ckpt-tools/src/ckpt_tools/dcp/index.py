"""A DCP checkpoint directory as a chunk table, read without torch.

torch's DCP writes one `.metadata` pickle (every tensor's shape, dtype and saved chunks, and where each
chunk lies: file, offset, length) plus `.distcp` files holding the chunks. This module turns the
metadata into plain frozen dataclasses through the restricted unpickler, so `ckpt inspect` answers
without importing torch, and locates each chunk's raw element bytes inside its `torch.save` record so
conversion can copy them by offset instead of loading tensors.

The metadata is untrusted (see `untrusted`): `.metadata` is read only as a regular file under a size
limit, every field is type- and range-checked into the dataclasses below (one line naming the entry
otherwise), and every `relative_path` must name a file inside the DCP directory, so no record can make
a reader copy bytes from elsewhere.
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
from dataclasses import dataclass, field
from typing import IO, Any

from ckpt_tools.dcp.safe_pickle import (
    MAX_DIMS,
    BytesStorageMetadata,
    Metadata,
    TensorStorageMetadata,
    load_tensor_record,
    restricted_loads,
)
from ckpt_tools.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NotACheckpointError,
    UnsafePickleError,
)
from ckpt_tools.files import storage
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import ITEMSIZE, SAFETENSORS_TO_TORCH, nbytes, safetensors_code
from ckpt_tools.format.untrusted import MAX_METADATA_BYTES, describe, is_count

_MAX_RECORD_PICKLE = 1 << 20
"""A chunk record's `data.pkl` names one tensor in a few hundred bytes."""


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
    fs, inner = storage.resolve(root)
    if not fs.exists(inner):
        raise CheckpointNotFoundError(f"{root}: no such file or directory")
    meta_path = f"{inner}/{layout.DCP_METADATA}"
    if not fs.isdir(inner) or not fs.exists(meta_path):
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
        raise CorruptCheckpointError(problems[0])
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


def dcp_file_problems(index: DcpIndex) -> list[str]:
    """One line per referenced `.distcp` file that is missing or shorter than its furthest record."""
    fs, inner = storage.resolve(index.path)
    needed: dict[str, int] = {}
    records = [(c.file, c.file_offset + c.length) for t in index.tensors.values() for c in t.chunks]
    records += [(o.file, o.file_offset + o.length) for o in index.objects.values()]
    for file, end in records:
        needed[file] = max(needed.get(file, 0), end)
    listed = {entry["name"].rstrip("/").rsplit("/", 1)[-1]: entry for entry in fs.ls(inner, detail=True)}
    sizes = {
        name: int(entry.get("size") or 0) for name, entry in listed.items() if entry.get("type") == "file"
    }
    problems = []
    for file, end in sorted(needed.items()):
        if file in listed and file not in sizes:
            problems.append(f"{index.path}/{file} is not a regular file: refused; .metadata references it")
            continue
        if file not in sizes and fs.isfile(f"{inner}/{file}"):  # a record in a subdirectory
            sizes[file] = int(fs.size(f"{inner}/{file}"))
        if file not in sizes:
            problems.append(f"{index.path}/{file} is missing; .metadata references it")
        elif sizes[file] < end:
            problems.append(
                f"{index.path}/{file} is truncated: {sizes[file]} bytes, .metadata needs {end}; "
                "the save was interrupted, use another checkpoint"
            )
    return problems


# --- model keys ----------------------------------------------------------------------------------
# Which tensors of a DCP directory are model weights. Tools nest their state differently:
#   ours, torch's plain `dcp.save(model_sd)`         model tensors at the top level
#   accelerate's save_state (FSDP)                  `{"model": sd}` in pytorch_model_fsdp_0/,
#                                                   `{"optimizer": osd}` in optimizer_0/
#   torchtitan's CheckpointManager                  model tensors at the top level beside a nested
#                                                   `optimizer` (and lr_scheduler, dataloader, ...)
#   torch's get_state_dict pair                     `{"model": sd, "optim": osd}`
# Optimizer state is recognised by its root key, nested or flattened (`optimizer.state.w.exp_avg`,
# or a flattened optimizer state dict's own `state.` / `param_groups.` keys at the top level), so a
# model whose top-level module is itself called `optimizer` or `state` would be misread: none is.

_MODEL_ROOT = "model"
_OPTIMIZER_ROOT = re.compile(
    r"^(optim|optimizer|optimizers|optimizer_state|optim_state)(_\d+)?$|^(state|param_groups)$"
)

# (in angle brackets, so no root key of a saved state dict is mistaken for one)
MODEL_WRAPPED = "<model>"  # tensors under a `model` entry
TOP_LEVEL = "<top level>"  # tensors saved at the top level of the state dict
OPTIMIZER_STATE = "<optimizer>"  # tensors under an optimizer root


def tensor_roles(index: DcpIndex) -> dict[str, list[str]]:
    """The tensor keys of a DCP directory by where they sit: `MODEL_WRAPPED`, `TOP_LEVEL`,
    `OPTIMIZER_STATE`, or the name of any other root entry they are nested under."""
    roles: dict[str, list[str]] = {}
    for name in index.tensors:
        path = index.paths.get(name)
        root = path[0] if path and len(path) > 1 else None
        first = name.split(".", 1)[0]
        if root is None and "." in name and _OPTIMIZER_ROOT.match(first):
            root = first  # a flattened optimizer state dict (`state.<param>.exp_avg`) or prefix
        if root is None:
            role = TOP_LEVEL
        elif root == _MODEL_ROOT:
            role = MODEL_WRAPPED
        elif _OPTIMIZER_ROOT.match(root):
            role = OPTIMIZER_STATE
        else:
            role = root
        roles.setdefault(role, []).append(name)
    return roles


def model_tensors(index: DcpIndex) -> dict[str, TensorEntry]:
    """The model weights of a DCP checkpoint, under their model state-dict names; optimizer state is
    never returned, in any layout.

    Tensors under a `model` entry lose that wrapper; top-level tensors keep their names. A directory
    whose weights cannot be told apart (top-level tensors beside a `model` entry, or tensors nested
    under a root that is neither) is refused rather than guessed; one holding only optimizer state
    raises too.
    """
    if not index.tensors:
        raise NotACheckpointError(
            f"{index.path} holds no tensors ({len(index.objects)} other entries): no model weights"
        )
    roles = tensor_roles(index)
    candidates = sorted(role for role in roles if role != OPTIMIZER_STATE)
    if not candidates:
        raise NotACheckpointError(
            f"{index.path} holds optimizer state only, no model weights: convert the model's "
            f"DCP directory ({layout.MODEL_DCP_DIR}/) instead"
        )
    if len(candidates) > 1 or candidates[0] not in (MODEL_WRAPPED, TOP_LEVEL):
        where = ", ".join(
            "the top level" if r == TOP_LEVEL else repr(_MODEL_ROOT if r == MODEL_WRAPPED else r)
            for r in candidates
        )
        raise NotACheckpointError(
            f"{index.path} holds tensors under {where}: which are the model weights is ambiguous; "
            "save the model alone (or under 'model') and the optimizer under 'optimizer'"
        )
    if candidates[0] == MODEL_WRAPPED:
        return {".".join(index.paths[name][1:]): index.tensors[name] for name in roles[MODEL_WRAPPED]}
    return {name: index.tensors[name] for name in roles[TOP_LEVEL]}


def optimizer_tensors(index: DcpIndex) -> dict[str, TensorEntry]:
    """The optimizer-state tensors of a DCP checkpoint, under their saved (flattened) keys."""
    return {name: index.tensors[name] for name in tensor_roles(index).get(OPTIMIZER_STATE, [])}


# --- chunk records -------------------------------------------------------------------------------

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"


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
    except (
        zipfile.BadZipFile,
        EOFError,
        struct.error,
        ValueError,
        OverflowError,
        NotImplementedError,
    ) as exc:
        raise CorruptCheckpointError(f"{where}: chunk record is damaged ({str(exc)[:200]})") from None


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
