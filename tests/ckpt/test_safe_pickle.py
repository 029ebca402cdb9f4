"""The restricted unpickler reads real DCP metadata and refuses everything else without running it."""

from __future__ import annotations

import io
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tools.dcp.safe_pickle import (
    Metadata,
    TensorStorageMetadata,
    load_tensor_record,
    restricted_loads,
)
from ckpt_tools.errors import CorruptCheckpointError, UnsafePickleError


class _CreatesFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture(scope="module")
def metadata_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("dcp")
    state = {"w": torch.randn(3, 5), "n": torch.arange(4), "h": torch.ones(2, dtype=torch.bfloat16), "x": 7}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return (path / ".metadata").read_bytes()


def test_reads_real_metadata_into_stand_ins(metadata_bytes: bytes) -> None:
    metadata = restricted_loads(metadata_bytes)
    assert isinstance(metadata, Metadata)
    entry = metadata.state_dict_metadata["w"]
    assert isinstance(entry, TensorStorageMetadata)
    assert entry.size == (3, 5)
    assert entry.properties.dtype == "float32"
    assert metadata.state_dict_metadata["h"].properties.dtype == "bfloat16"
    assert [tuple(c.sizes) for c in entry.chunks] == [(3, 5)]
    assert "torch.distributed.checkpoint.metadata" not in type(metadata).__module__


def test_refuses_code_execution_without_running_it(tmp_path) -> None:
    target = tmp_path / "pwned"
    payload = pickle.dumps({"state_dict_metadata": _CreatesFile(str(target))})
    with pytest.raises(UnsafePickleError, match=r"(posix|os)\.system"):
        restricted_loads(payload)
    assert not target.exists()


@pytest.mark.parametrize("name", ["builtins.eval", "subprocess.Popen", "torch._utils._rebuild_tensor_v2"])
def test_refuses_other_globals_naming_them(name: str) -> None:
    module, attr = name.rsplit(".", 1)
    payload = b"\x80\x04c" + f"{module}\n{attr}\n".encode() + b")R."
    with pytest.raises(UnsafePickleError, match=name.replace(".", r"\.")):
        restricted_loads(payload)


def test_truncated_pickle_is_corrupt_not_unsafe(metadata_bytes: bytes) -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        restricted_loads(metadata_bytes[: len(metadata_bytes) // 2])
    assert not isinstance(info.value, UnsafePickleError)


def test_persistent_ids_are_refused_in_metadata() -> None:
    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return "x" if obj == "s" else None

    import io

    buf = io.BytesIO()
    P(buf).dump(["s"])
    with pytest.raises(UnsafePickleError):
        restricted_loads(buf.getvalue())


def test_tensor_record_matches_torch_save(tmp_path) -> None:
    import zipfile

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save(base[1:3], tmp_path / "t.pt")
    with zipfile.ZipFile(tmp_path / "t.pt") as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        record = load_tensor_record(archive.read(name))
    assert record.shape == (2, 6)
    assert record.stride == (6, 1)
    assert record.storage_offset == 6
    assert record.storage.dtype == "float32"
    assert record.storage.numel == 24


class _Ref:
    def __init__(self, pid: tuple) -> None:
        self.pid = pid


class _PersistentPickler(pickle.Pickler):
    def persistent_id(self, obj):  # type: ignore[no-untyped-def]
        return obj.pid if isinstance(obj, _Ref) else None


@pytest.mark.parametrize(
    "pid",
    [
        ("storage", "float32", "0", "cpu"),
        ("storage", "float32", "0", "cpu", 4, "extra"),
        ("tensor", "float32", "0", "cpu", 4),
        ("module", "float32", "0", "cpu", 4),
        ("module", 1),
    ],
)
def test_a_storage_reference_of_another_shape_is_refused_not_misread(pid: tuple) -> None:
    """Refused as unsafe (so convert hands the chunk to torch's weights_only loader), not reported as a
    damaged file: torch's own references have exactly 5 fields and start with "storage"."""
    buf = io.BytesIO()
    _PersistentPickler(buf, protocol=2).dump(_Ref(pid))
    with pytest.raises(UnsafePickleError, match="refused persistent reference"):
        load_tensor_record(buf.getvalue())


_DTYPES = sorted({str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)})
_PACKED_BITS = {"bits1x8", "bits2x4", "bits4x2"}  # raw bit containers, not tensor element types


@pytest.mark.parametrize("name", [n for n in _DTYPES if n not in _PACKED_BITS])
def test_every_torch_dtype_is_read_by_name(name: str) -> None:
    """DCP metadata records each tensor's dtype as a torch global: every element type torch has must
    pass the allow-list, or a checkpoint of that dtype could not even be inspected."""
    loaded = restricted_loads(pickle.dumps({"dtype": getattr(torch, name)}))
    assert loaded == {"dtype": name}


class _SlotState:
    """Pickles as a DCP metadata class whose state is (dict state, slot state), as a dataclass with
    `__slots__` does."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return (ChunkStorageMetadata, (), (None, {"offsets": (0,), "sizes": (3,)}))


def test_slot_state_of_a_metadata_class_is_read() -> None:
    loaded = restricted_loads(pickle.dumps(_SlotState()))
    assert (loaded.offsets, loaded.sizes) == ((0,), (3,))


@pytest.mark.parametrize("pid", [("storage", 7, "0", "cpu", 4), ("storage", "float32", 0, "cpu", 4)])
def test_a_storage_reference_with_a_non_text_field_is_malformed(pid: tuple) -> None:
    buf = io.BytesIO()
    _PersistentPickler(buf, protocol=2).dump(_Ref(pid))
    with pytest.raises(CorruptCheckpointError, match="malformed storage reference"):
        load_tensor_record(buf.getvalue())


@pytest.mark.parametrize(("module", "name"), [("os", "float32"), ("zipfile", "float32"), ("torch", "load")])
def test_enum_names_come_only_from_torch_and_only_enum_names(module: str, name: str) -> None:
    with pytest.raises(UnsafePickleError, match=rf"asks for {module}\.{name}"):
        restricted_loads(b"\x80\x04c" + f"{module}\n{name}\n".encode() + b".")
