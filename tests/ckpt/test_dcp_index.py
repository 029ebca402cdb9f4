"""DCP metadata as a chunk table: shapes, dtypes, chunk locations, model-key extraction, bad inputs."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tools.dcp.index import ChunkEntry, read_dcp_index
from ckpt_tools.dcp.records import locate_chunk_data
from ckpt_tools.dcp.roles import model_tensors
from ckpt_tools.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NotACheckpointError,
    UnsafePickleError,
)
from ckpt_tools.format.dtypes import SAFETENSORS_TO_TORCH


def _save(path, state) -> str:
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return str(path)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, torch.Tensor]]:
    tensors = {
        "enc.weight": torch.randn(5, 3),
        "enc.bias": torch.randn(5).to(torch.bfloat16),
        "steps": torch.arange(6, dtype=torch.int32),
        "mask": torch.tensor([True, False, True]),
    }
    return _save(tmp_path_factory.mktemp("plain"), {**tensors, "note": "hello"}), tensors


def test_index_lists_tensors_and_objects(plain) -> None:
    path, tensors = plain
    index = read_dcp_index(path)
    assert set(index.tensors) == set(tensors)
    assert set(index.objects) == {"note"}
    assert index.tensors["enc.weight"].shape == (5, 3)
    assert index.tensors["enc.weight"].dtype == "F32"
    assert index.tensors["enc.bias"].dtype == "BF16"
    assert index.tensors["mask"].dtype == "BOOL"
    assert index.tensors["enc.weight"].nbytes == 60
    assert index.total_bytes == sum(t.numel() * t.element_size() for t in tensors.values())


def test_chunk_bytes_located_by_offset_equal_torch(plain) -> None:
    path, tensors = plain
    index = read_dcp_index(path)
    for name, entry in index.tensors.items():
        (chunk,) = entry.chunks
        with open(os.path.join(path, chunk.file), "rb") as handle:
            span = locate_chunk_data(handle, chunk, entry.dtype, name)
            assert span is not None
            handle.seek(span.offset)
            raw = bytearray(handle.read(span.length))
        dtype = getattr(torch, SAFETENSORS_TO_TORCH[entry.dtype])
        got = torch.frombuffer(raw, dtype=dtype).reshape(entry.shape)
        assert torch.equal(got, tensors[name])


def test_index_needs_no_torch(plain) -> None:
    code = (
        "import sys; from ckpt_tools.dcp.index import read_dcp_index; "
        f"i = read_dcp_index({plain[0]!r}); assert 'torch' not in sys.modules; print(len(i.tensors))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"


def test_reads_through_fsspec_memory(plain) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in os.listdir(plain[0]):
        fs.pipe(f"/dcpmem/{name}", Path(plain[0], name).read_bytes())
    index = read_dcp_index("memory://dcpmem")
    assert index.tensors["enc.weight"].shape == (5, 3)


def test_model_keys_from_combined_checkpoint(tmp_path) -> None:
    weight = torch.randn(4, 2)
    state = {
        "model": {"model.layer.weight": weight, "head.bias": torch.zeros(2)},
        "optim": {"state": {"head.bias": {"exp_avg": torch.ones(2)}}},
    }
    index = read_dcp_index(_save(tmp_path / "c", state))
    assert set(model_tensors(index)) == {"model.layer.weight", "head.bias"}
    optim_only = read_dcp_index(_save(tmp_path / "o", {"state": {"w": {"exp_avg": weight}}}))
    with pytest.raises(NotACheckpointError, match="optimizer state only"):
        model_tensors(optim_only)


def test_missing_path(tmp_path) -> None:
    with pytest.raises(CheckpointNotFoundError):
        read_dcp_index(tmp_path / "nope")


def test_directory_without_metadata(tmp_path) -> None:
    with pytest.raises(NotACheckpointError, match=r"\.metadata"):
        read_dcp_index(tmp_path)


def test_truncated_shard_is_named(tmp_path) -> None:
    path = _save(tmp_path / "t", {"w": torch.randn(64, 64)})
    shard = next(n for n in os.listdir(path) if n.endswith(".distcp"))
    with open(os.path.join(path, shard), "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(CorruptCheckpointError, match=f"{shard} is truncated"):
        read_dcp_index(path)


def test_truncated_metadata(tmp_path) -> None:
    path = _save(tmp_path / "m", {"w": torch.randn(2)})
    meta = Path(path, ".metadata")
    meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 3])
    with pytest.raises(CorruptCheckpointError, match="truncated or damaged"):
        read_dcp_index(path)


def test_malicious_metadata_is_refused_and_not_executed(tmp_path) -> None:
    target = tmp_path / "created"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(UnsafePickleError):
        read_dcp_index(tmp_path)
    assert not target.exists()


def test_file_problems_are_all_listed_when_not_checked_on_read(tmp_path) -> None:
    from ckpt_tools.dcp.index import dcp_file_problems

    path = _save(tmp_path / "t", {"w": torch.randn(64, 64)})
    shard = next(n for n in os.listdir(path) if n.endswith(".distcp"))
    os.remove(os.path.join(path, shard))
    index = read_dcp_index(path, check_files=False)
    assert index.tensors["w"].shape == (64, 64)
    (finding,) = dcp_file_problems(index)
    assert finding.path == f"{path}/{shard}"  # keyed by the file, so verify names it once
    assert finding.message == f"{finding.path} is missing; .metadata references it"
    with pytest.raises(CorruptCheckpointError, match=f"{shard} is missing"):
        read_dcp_index(path)


def test_top_level_tensors_beside_a_model_entry_are_ambiguous(tmp_path) -> None:
    index = read_dcp_index(_save(tmp_path / "a", {"w": torch.zeros(2), "model": {"b": torch.zeros(1)}}))
    with pytest.raises(NotACheckpointError) as refused:
        model_tensors(index)
    assert str(refused.value) == (
        f"{index.path} holds tensors under 'model', the top level: which are the model weights is ambiguous; "
        "save the model alone (or under 'model') and the optimizer under 'optimizer'"
    )


def test_a_shard_that_is_a_directory_is_refused(tmp_path) -> None:
    path = _save(tmp_path / "d", {"w": torch.randn(4)})
    shard = next(n for n in os.listdir(path) if n.endswith(".distcp"))
    os.remove(os.path.join(path, shard))
    os.mkdir(os.path.join(path, shard))
    with pytest.raises(CorruptCheckpointError, match=f"{shard} is not a regular file: refused"):
        read_dcp_index(path)


def test_a_shard_cut_inside_an_object_record_is_truncated(tmp_path) -> None:
    path = _save(tmp_path / "o", {"note": "x" * 200, "step": 7})  # objects only: no tensor record ends later
    index = read_dcp_index(path, check_files=False)
    end = max(o.file_offset + o.length for o in index.objects.values())
    file = next(iter(index.objects.values())).file
    with open(os.path.join(path, file), "r+b") as handle:
        handle.truncate(end - 1)
    with pytest.raises(
        CorruptCheckpointError, match=f"{file} is truncated: {end - 1} bytes, .metadata needs {end}"
    ):
        read_dcp_index(path)


def _locate_saved(file: Path, record: torch.Tensor) -> tuple[object, bytes]:
    """torch.save `record` as a one-record file and locate it as the F32 chunk (4, 3) of a tensor."""
    torch.save(record, file)
    chunk = ChunkEntry((0, 0), (4, 3), file.name, 0, file.stat().st_size, ())
    with open(file, "rb") as handle:
        found = locate_chunk_data(handle, chunk, "F32", file.name)
        if found is None:
            return None, b""
        handle.seek(found.offset)
        return found, handle.read(found.length)


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (torch.arange(12.0).reshape(3, 4).t(), "a non-contiguous view"),
        (torch.arange(12.0).as_strided((4, 3), (2, 1)), "rows that overlap"),
        (torch.arange(24.0).as_strided((4, 3), (6, 2)), "every other element"),
        (torch.arange(12.0).reshape(2, 6), "another shape of as many elements"),
        (torch.arange(12, dtype=torch.int32).reshape(4, 3), "another dtype of the same size"),
    ],
)
def test_a_record_the_byte_copy_cannot_take_is_left_to_torch(tmp_path, record, why) -> None:
    """The offset reader claims a record only when its bytes are the chunk's C-contiguous elements."""
    assert _locate_saved(tmp_path / "odd.distcp", record) == (None, b""), why
    found, data = _locate_saved(tmp_path / "plain.distcp", torch.arange(12.0).reshape(4, 3))
    assert found is not None and data == torch.arange(12.0).numpy().tobytes()
