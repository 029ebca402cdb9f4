"""The safetensors header reader: one test per rule of the format, on files written by the safetensors
library and on hand-crafted damaged ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import fsspec
import pytest
import torch
from safetensors.torch import save_file

from ckpt_tools.errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError
from ckpt_tools.files.safetensors_io import SafetensorsTensorInfo, read_safetensors_header


def raw_file(path: Path, header: dict, data: bytes = b"", pad: bytes = b"") -> Path:
    """A safetensors file byte by byte: 8-byte little-endian length, JSON header, data."""
    text = json.dumps(header).encode() + pad
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_reads_what_the_safetensors_library_writes(tmp_path: Path) -> None:
    tensors = {
        "w": torch.randn(3, 5),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.0, dtype=torch.bfloat16),
        "ids": torch.arange(7, dtype=torch.int16),
        "mask": torch.ones(3, dtype=torch.bool),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    header = read_safetensors_header(path)
    assert header.file_size == path.stat().st_size
    assert header.metadata == {"format": "pt"}
    assert header.tensors["w"] == SafetensorsTensorInfo("w", "F32", (3, 5), header.tensors["w"].data_offsets)
    assert {n: (i.dtype, i.shape, i.nbytes) for n, i in header.tensors.items()} == {
        "w": ("F32", (3, 5), 60),
        "empty": ("F32", (0, 4), 0),
        "scalar": ("BF16", (), 2),
        "ids": ("I16", (7,), 14),
        "mask": ("BOOL", (3,), 3),
    }
    # the offsets point at the real bytes
    info = header.tensors["w"]
    raw = path.read_bytes()[
        header.data_start + info.data_offsets[0] : header.data_start + info.data_offsets[1]
    ]
    assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(3, 5), tensors["w"])
    assert header.total_bytes == 60 + 2 + 14 + 3


def test_reads_through_fsspec(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(2)}, str(path))
    with fsspec.open("memory://st/m.safetensors", "wb") as handle:
        handle.write(path.read_bytes())
    assert read_safetensors_header("memory://st/m.safetensors").tensors["a"].shape == (2,)


def test_header_may_be_padded_with_spaces(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "p.safetensors", {"a": entry("F32", [1], 0, 4)}, b"\0" * 4, pad=b"   ")
    assert read_safetensors_header(path).tensors["a"].data_offsets == (0, 4)


def test_truncated_data_names_file_and_sizes(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.ones(10)}, str(path))
    full = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(CorruptCheckpointError, match="truncated") as info:
        read_safetensors_header(path)
    message = str(info.value)
    assert str(path) in message and f"should have {full} bytes" in message and f"has {full - 7}" in message


def test_truncated_header(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "h.safetensors", {"a": entry("F32", [1], 0, 4)}, b"\0" * 4)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(
        CorruptCheckpointError, match=r"truncated: the header needs \d+ bytes but the file has 20"
    ):
        read_safetensors_header(path)


@pytest.mark.parametrize("content", [b"", b"\x01\x02\x03"])
def test_shorter_than_the_length_prefix(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "s.safetensors"
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError, match="too short"):
        read_safetensors_header(path)


def test_absurd_header_length_is_not_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(NotACheckpointError, match="exceeds the safetensors limit"):
        read_safetensors_header(path)


def test_header_must_be_a_json_object(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 4) + b"[1,2")
    with pytest.raises(NotACheckpointError, match="not a JSON object"):
        read_safetensors_header(path)


def test_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 6) + b'{"a": ')
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        read_safetensors_header(path)


def test_duplicate_keys_refused(tmp_path: Path) -> None:
    text = b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}'
    path = tmp_path / "d.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0\0")
    with pytest.raises(CorruptCheckpointError, match="lists 'a' twice"):
        read_safetensors_header(path)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (entry("F33", [1], 0, 4), "unknown dtype 'F33'"),
        (entry("F32", [-1], 0, 4), "not a list of non-negative integers"),
        (entry("F32", [1.5], 0, 4), "not a list of non-negative integers"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0]}, "not a pair"),
        (entry("F32", [2], 0, 4), "span 4 bytes but F32\\[2\\] needs 8"),
        ("nonsense", "expected an object"),
    ],
)
def test_each_entry_is_validated(tmp_path: Path, value: object, message: str) -> None:
    path = raw_file(tmp_path / "e.safetensors", {"a": value}, b"\0" * 4)
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        read_safetensors_header(path)
    assert "'a'" in str(info.value)


def test_hole_between_tensors(tmp_path: Path) -> None:
    header = {"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 3, 5)}
    path = raw_file(tmp_path / "h.safetensors", header, b"\0" * 5)
    with pytest.raises(CorruptCheckpointError, match="'b' at data offset 3 leaves a hole at byte 2"):
        read_safetensors_header(path)


def test_overlapping_tensors(tmp_path: Path) -> None:
    header = {"a": entry("U8", [3], 0, 3), "b": entry("U8", [2], 2, 4)}
    path = raw_file(tmp_path / "o.safetensors", header, b"\0" * 4)
    with pytest.raises(CorruptCheckpointError, match="'b' at data offset 2 overlaps"):
        read_safetensors_header(path)


def test_data_must_start_at_zero(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "z.safetensors", {"a": entry("U8", [2], 1, 3)}, b"\0" * 3)
    with pytest.raises(CorruptCheckpointError, match="leaves a hole at byte 0"):
        read_safetensors_header(path)


def test_trailing_bytes_refused(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "t.safetensors", {"a": entry("U8", [2], 0, 2)}, b"\0" * 5)
    with pytest.raises(CorruptCheckpointError, match="3 trailing bytes"):
        read_safetensors_header(path)


def test_metadata_must_be_strings(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "m.safetensors", {"__metadata__": {"n": 1}})
    with pytest.raises(CorruptCheckpointError, match="__metadata__ must map strings to strings"):
        read_safetensors_header(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError):
        read_safetensors_header(tmp_path / "nope.safetensors")
    with pytest.raises(NotACheckpointError, match="is a directory"):
        read_safetensors_header(tmp_path)
