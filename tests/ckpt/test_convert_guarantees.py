"""What `ckpt convert` promises beyond equal tensors: bounded memory without torch on the common path,
aligned tensors in the written file, every check before the first byte is written, the re-read check
after it, and torch's `weights_only` loader for chunk records the offset reader cannot place.

Each test builds its DCP input from a safetensors file (`convert_safetensors_to_dcp`) and crafts the
damage itself, so it needs no launch.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tools import convert_dcp_to_safetensors, convert_safetensors_to_dcp, layout
from ckpt_tools.errors import CorruptCheckpointError
from helpers.high_water import run_child
from helpers.pickle_payload import TouchesFile

ITEMSIZE = {"I8": 1, "F16": 2, "F32": 4, "F64": 8}


def _dcp(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    source = tmp_path / "src" / layout.MODEL_SAFETENSORS
    source.parent.mkdir(parents=True)
    save_file(tensors, str(source))
    out = tmp_path / "src" / layout.MODEL_DCP_DIR
    convert_safetensors_to_dcp(source, out)
    source.unlink()
    return out


def _mixed() -> dict[str, torch.Tensor]:
    """Odd byte counts: written in name order, or narrowest first, some tensor would start at a byte
    offset its item size does not divide (the F64 one at byte 5 in name order)."""
    return {
        "a": torch.arange(5, dtype=torch.int8),
        "b": torch.tensor([1.5, -2.25, 3.0], dtype=torch.float64),
        "c": torch.arange(3, dtype=torch.float16),
        "d": torch.tensor([0.5], dtype=torch.float32),
    }


def _edit_metadata(dcp_dir: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Rewrite `.metadata` through torch's own classes (trusted here: the test wrote it)."""
    path = dcp_dir / layout.DCP_METADATA
    metadata = pickle.loads(path.read_bytes())
    edit(metadata)
    path.write_bytes(pickle.dumps(metadata))


def _outputs(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".safetensors" or p.name.startswith("."))


def test_every_tensor_starts_at_a_multiple_of_its_item_size(tmp_path: Path) -> None:
    result = convert_dcp_to_safetensors(_dcp(tmp_path, _mixed()), tmp_path / "out")
    data = Path(result.files[0]).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header.pop("__metadata__", None)
    start = 8 + length
    assert start % 8 == 0
    for name, info in header.items():
        assert (start + info["data_offsets"][0]) % ITEMSIZE[info["dtype"]] == 0, (name, info)
    got = load_file(result.files[0])
    assert all(torch.equal(got[k], v) for k, v in _mixed().items())


def _move_chunk(offsets: tuple[int, ...], sizes: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def edit(metadata) -> None:  # type: ignore[no-untyped-def]
        entry = metadata.state_dict_metadata["a"]
        chunk = dataclasses.replace(entry.chunks[0], offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        metadata.state_dict_metadata["a"] = dataclasses.replace(entry, chunks=[chunk])
        for index in [index for index in metadata.storage_data if index.fqn == "a"]:  # the record follows
            moved = dataclasses.replace(index, offset=torch.Size(offsets))
            metadata.storage_data[moved] = metadata.storage_data.pop(index)

    return edit


@pytest.mark.parametrize(
    ("offsets", "sizes", "message"),
    [
        ((1,), (5,), r"'a' \[5\]: chunk at offsets \[1\] sizes \[5\] lies outside the tensor"),
        ((0,), (4,), r"'a' \[5\]: chunks leave a gap \(they hold 4 of 5 elements"),
    ],
)
def test_chunk_checks_refuse_before_the_first_byte(tmp_path: Path, offsets, sizes, message) -> None:  # type: ignore[no-untyped-def]
    dcp_dir = _dcp(tmp_path, _mixed())
    _edit_metadata(dcp_dir, _move_chunk(offsets, sizes))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CorruptCheckpointError, match=message):
        convert_dcp_to_safetensors(dcp_dir, out)
    assert _outputs(out) == []


def test_a_written_header_unlike_the_plan_is_refused_and_discarded(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ckpt_tools.tools.convert.to_safetensors as convert

    class Misnaming(convert.SafetensorsStreamWriter):  # type: ignore[misc,name-defined]
        """A writer bug: the header names one tensor differently from the plan."""

        def __init__(self, path, specs, metadata=None) -> None:  # type: ignore[no-untyped-def]
            specs = list(specs)
            specs[0] = dataclasses.replace(specs[0], name=specs[0].name + "_renamed")
            super().__init__(path, specs, metadata)

    monkeypatch.setattr(convert, "SafetensorsStreamWriter", Misnaming)
    dcp_dir = _dcp(tmp_path, _mixed())
    out = tmp_path / "out"
    with pytest.raises(CorruptCheckpointError, match="the written header does not match the DCP metadata"):
        convert_dcp_to_safetensors(dcp_dir, out)
    assert _outputs(out) == []


def _malicious_record(payload: object) -> bytes:
    """A real torch.save record whose data.pkl is replaced: torch's zip reader accepts it, only the
    unpickler stands between the payload and the process."""
    clean = io.BytesIO()
    torch.save(torch.zeros(3, dtype=torch.float64), clean)
    crafted = io.BytesIO()
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(crafted, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = pickle.dumps(payload) if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, data)
    return crafted.getvalue()


def test_fallback_loader_runs_no_pickle_payload(tmp_path: Path) -> None:
    """The restricted reader refuses the record, so the chunk goes to torch's loader, which must be the
    `weights_only` one: the payload is refused, not run."""
    target = tmp_path / "payload_ran"
    dcp_dir = _dcp(tmp_path, _mixed())
    record = _malicious_record(TouchesFile(target))

    def point_b_at_the_record(metadata) -> None:  # type: ignore[no-untyped-def]
        for index, info in list(metadata.storage_data.items()):
            if index.fqn == "b":
                shard = dcp_dir / info.relative_path
                offset = shard.stat().st_size
                with shard.open("ab") as handle:
                    handle.write(record)
                metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(record))

    _edit_metadata(dcp_dir, point_b_at_the_record)
    out = tmp_path / "out"
    with pytest.raises(CorruptCheckpointError, match=r"\(b at \[0\]\): unreadable chunk record"):
        convert_dcp_to_safetensors(dcp_dir, out)
    assert not target.exists()
    assert not out.exists() or _outputs(out) == []


_MEASURE = """
import json, sys
import ckpt_tools.tools.convert as convert
before = peak_kib()
convert.convert_dcp_to_safetensors(sys.argv[1], sys.argv[2])
print(json.dumps({"grew_kib": peak_kib() - before, "torch": "torch" in sys.modules}))
"""


def test_common_path_streams_without_torch_in_bounded_memory(tmp_path: Path) -> None:
    """A tensor 32 times the copy buffer, sharded along rows (the FSDP case): converted by byte copies
    in a fresh process that never imports torch and whose peak memory grows by far less than it."""
    size_mib = 32
    tensor = torch.arange(size_mib * 1024 * 1024 // 4, dtype=torch.float32).reshape(-1, 128)  # 2-D: rows
    dcp_dir = _dcp(tmp_path, {"big": tensor, "small": torch.ones(3)})
    out = tmp_path / "out"
    measured = run_child(_MEASURE, str(dcp_dir), str(out), timeout=120)
    assert measured["torch"] is False
    assert measured["grew_kib"] < size_mib * 1024 // 4, measured
    assert torch.equal(load_file(str(out / layout.MODEL_SAFETENSORS))["big"], tensor)
