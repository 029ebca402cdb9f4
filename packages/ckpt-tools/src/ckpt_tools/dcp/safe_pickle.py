"""Restricted unpickling of the two pickles a DCP checkpoint holds, without importing torch.

torch writes a DCP directory's `.metadata` with `pickle`, and every tensor chunk inside a `.distcp` file
is a `torch.save` archive whose `data.pkl` is a pickle too. Unpickling either with the standard
unpickler would run whatever callable the file names, so a checkpoint downloaded from somewhere could
execute code on `ckpt inspect`. These unpicklers resolve only an allow-list of globals, each to a plain
stand-in defined here (never the torch class), and refuse everything else by name before any call.

The work is bounded by the input. The C unpickler does constant work per opcode (each builds at most
one object, a container grows by one reference per input byte or more, nesting lives on its own heap
stack), so the caller's size limit on the file (`untrusted.MAX_METADATA_BYTES`) bounds objects,
container sizes and time. The only calls a pickle can make are the stand-ins below, and each bounds
what it builds (a `torch.Size` of at most `MAX_DIMS` dimensions, a path of at most `MAX_PATH`
characters), so a small file cannot ask for a large result. Nothing here `repr`s an unpickled value:
a self-referencing list would make that unbounded; messages use `untrusted.describe`.
"""

from __future__ import annotations

import collections
import io
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_tools.errors import CorruptCheckpointError, UnsafePickleError
from ckpt_tools.format.untrusted import describe, is_count

MAX_DIMS = 64
"""More dimensions than any tensor has (torch allows 64)."""
MAX_PATH = 4096

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_DCP_FILESYSTEM = "torch.distributed.checkpoint.filesystem"


class _Record:
    """Stand-in for a torch dataclass: pickle's BUILD fills `__dict__` from the saved state."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (dict state, slot state)
        if not isinstance(state, dict):
            raise CorruptCheckpointError(f"unexpected pickled state for {type(self).__name__}")
        if not all(isinstance(key, str) for key in state):
            raise CorruptCheckpointError(
                f"pickled state for {type(self).__name__} has a non-string field name"
            )
        self.__dict__.update(state)

    def __getattr__(self, name: str) -> Any:
        # Fields left at their class default are not pickled; read them as None.
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def __repr__(self) -> str:
        # Bounded: the fields are untrusted and may reference themselves.
        fields = ", ".join(f"{k}={describe(v)}" for k, v in list(self.__dict__.items())[:8])
        return f"{type(self).__name__}({fields})"


class Metadata(_Record):
    """DCP `Metadata`: state_dict_metadata, planner_data, storage_data, storage_meta, version."""


class TensorStorageMetadata(_Record):
    """A tensor entry: `properties`, `size` (tuple), `chunks` (list of ChunkStorageMetadata)."""


class BytesStorageMetadata(_Record):
    """A non-tensor entry (pickled by torch as opaque bytes)."""


class ChunkStorageMetadata(_Record):
    """One saved chunk of a tensor: `offsets` and `sizes` (tuples)."""


class MetadataIndex(_Record):
    """Key of `storage_data`: `fqn`, `offset` (tuple or None), `index`."""


class StorageInfo(_Record):
    """Value of `storage_data`: `relative_path`, `offset`, `length`, `transform_descriptors`."""


class StorageMeta(_Record):
    """Informational: checkpoint_id, save_id, load_id, modules."""


class TensorProperties(_Record):
    """`dtype` (a TorchName like `float32`), layout, requires_grad, memory_format, pin_memory."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 5:
            keys = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")
            self.__dict__.update(zip(keys, state, strict=True))
        else:
            super().__setstate__(state)


class TorchName(str):
    """A torch enum value (dtype, layout, memory format) kept as its name: `float32`, `strided`."""

    __slots__ = ()


def _size(dims: Any = ()) -> tuple[int, ...]:
    if not isinstance(dims, (list, tuple)) or len(dims) > MAX_DIMS or not all(is_count(d) for d in dims):
        raise CorruptCheckpointError(
            f"a pickled torch.Size holds {describe(dims)}, not at most {MAX_DIMS} sizes in int64 range"
        )
    return tuple(dims)


def _layout(name: str) -> TorchName:
    if not isinstance(name, str) or len(name) > 64 or not re.fullmatch(r"torch\.\w+", name):
        raise UnsafePickleError(f"refused layout argument {describe(name)}")
    return TorchName(name.removeprefix("torch."))


def _mem_format(value: int) -> int:
    if not is_count(value):
        raise CorruptCheckpointError(f"a pickled memory format is {describe(value)}, not a small integer")
    return value


def _path(*parts: str) -> str:
    # pathlib.PosixPath(*parts) without touching the filesystem: only informational fields use it.
    # Bounded before joining: many references to one long string would otherwise multiply it.
    if not all(isinstance(p, str) for p in parts):
        raise UnsafePickleError("refused a pickled path with non-string parts")
    if len(parts) > MAX_PATH or sum(len(p) + 1 for p in parts) > MAX_PATH:
        raise CorruptCheckpointError(f"a pickled path is longer than {MAX_PATH} characters")
    return "/".join(parts).replace("//", "/")


_TORCH_ENUM_NAMES = frozenset(
    {
        # dtypes
        *(f"float{n}" for n in (16, 32, 64)),
        *(f"int{n}" for n in range(1, 8)),
        *(f"int{n}" for n in (8, 16, 32, 64)),
        *(f"uint{n}" for n in range(1, 8)),
        *(f"uint{n}" for n in (8, 16, 32, 64)),
        *(f"complex{n}" for n in (32, 64, 128)),
        "bfloat16",
        "bool",
        "half",
        "float",
        "double",
        "long",
        "int",
        "short",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
        "quint8",
        "qint8",
        "qint32",
        "quint4x2",
        "quint2x4",
        "bits8",
        "bits16",
        # layouts and memory formats
        "strided",
        "sparse_coo",
        "contiguous_format",
        "channels_last",
        "preserve_format",
    }
)

_METADATA_GLOBALS: dict[tuple[str, str], Any] = {
    (_DCP_METADATA, "Metadata"): Metadata,
    (_DCP_METADATA, "TensorStorageMetadata"): TensorStorageMetadata,
    (_DCP_METADATA, "BytesStorageMetadata"): BytesStorageMetadata,
    (_DCP_METADATA, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (_DCP_METADATA, "TensorProperties"): TensorProperties,
    (_DCP_METADATA, "MetadataIndex"): MetadataIndex,
    (_DCP_METADATA, "StorageMeta"): StorageMeta,
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"): _mem_format,
    (_DCP_FILESYSTEM, "_StorageInfo"): StorageInfo,
    ("torch", "Size"): _size,
    ("torch.serialization", "_get_layout"): _layout,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("pathlib", "PosixPath"): _path,
    ("pathlib", "PurePosixPath"): _path,
    ("pathlib", "WindowsPath"): _path,
    ("pathlib", "PureWindowsPath"): _path,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves globals through a table; anything else is refused before it could be called."""

    def __init__(
        self,
        data: bytes,
        table: dict[tuple[str, str], Any],
        what: str,
        persistent: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._table = table
        self._what = what
        self._persistent = persistent

    def find_class(self, module: str, name: str) -> Any:
        found = self._table.get((module, name))
        if found is not None:
            return found
        if module == "torch" and name in _TORCH_ENUM_NAMES:
            return TorchName(name)
        raise UnsafePickleError(
            f"{self._what} asks for {module[:100]}.{name[:100]}, which is not a DCP metadata class: refused "
            "without executing it; only open checkpoints from sources you trust"
        )

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise UnsafePickleError(f"{self._what} holds a persistent reference: refused")
        return self._persistent(pid)


def _loads(unpickler: _RestrictedUnpickler) -> Any:
    try:
        return unpickler.load()
    except UnsafePickleError:
        raise
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # truncated or malformed pickle: any exception type is possible
        raise CorruptCheckpointError(
            f"{unpickler._what} is not a readable pickle ({type(exc).__name__}: {str(exc)[:200]}); "
            "the file is truncated or damaged"
        ) from None


def restricted_loads(data: bytes, what: str = "DCP .metadata") -> Any:
    """Unpickle DCP `.metadata` into the plain stand-ins above; refuse any other global.

    `what` names the file in error messages.
    """
    return _loads(_RestrictedUnpickler(data, _METADATA_GLOBALS, what))


# --- torch.save tensor records (the `data.pkl` of each chunk archive) ---------------------------


@dataclass(frozen=True)
class StorageRef:
    """A persistent reference to a storage inside a torch.save archive (`data/<key>`)."""

    key: str
    dtype: str  # torch dtype name, e.g. `float32`
    numel: int


@dataclass(frozen=True)
class TensorRecord:
    """What `torch.load` would rebuild, as plain numbers: enough to read the bytes by offset."""

    storage: StorageRef
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


# Typed storage classes torch pickles for each dtype (legacy names, still written by torch.save).
_STORAGE_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "Float8_e4m3fnStorage": "float8_e4m3fn",
    "Float8_e5m2Storage": "float8_e5m2",
    "UInt16Storage": "uint16",
    "UInt32Storage": "uint32",
    "UInt64Storage": "uint64",
}


def _rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any, *_rest: Any) -> TensorRecord:
    if not isinstance(storage, StorageRef):
        raise CorruptCheckpointError("tensor record does not reference a storage")
    if not is_count(storage_offset):
        raise CorruptCheckpointError(f"tensor record has storage offset {describe(storage_offset)}")
    return TensorRecord(storage, storage_offset, _size(size), _size(stride))


def _storage_ref(pid: Any) -> StorageRef:
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
        raise UnsafePickleError(f"refused persistent reference {describe(pid)}")
    _, dtype, key, _location, numel = pid
    if not isinstance(dtype, str) or not isinstance(key, str) or not is_count(numel) or len(key) > MAX_PATH:
        raise CorruptCheckpointError("malformed storage reference in a tensor record")
    return StorageRef(key=key, dtype=str(dtype), numel=numel)


_TENSOR_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", name): TorchName(dtype) for name, dtype in _STORAGE_DTYPES.items()},
}


def load_tensor_record(data: bytes, what: str = "tensor record") -> TensorRecord:
    """Read a torch.save `data.pkl` holding one plain tensor, without torch and without executing it.

    Raises UnsafePickleError for anything else (a tensor subclass, a non-tensor object), which the
    caller may then choose to load with torch's own `weights_only` loader.
    """
    record = _loads(_RestrictedUnpickler(data, _TENSOR_GLOBALS, what, persistent=_storage_ref))
    if not isinstance(record, TensorRecord):
        raise UnsafePickleError(f"{what} holds {describe(record)}, not a plain tensor")
    return record
