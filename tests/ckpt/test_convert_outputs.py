"""Where `ckpt convert` writes and what it leaves: default DCP names for a model and an adapter file,
nothing beside the output even for a bare relative name, stale shards of an earlier layout removed on
--overwrite, an output inside the input refused, and every size unit of --max-shard-size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ckpt_tools import convert_dcp_to_safetensors, convert_safetensors_to_dcp, layout
from ckpt_tools.errors import CheckpointError
from ckpt_tools.tools.convert import parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("7", 7),
        ("1B", 1),
        ("1KB", 10**3),
        ("1MB", 10**6),
        ("1GB", 10**9),
        ("1TB", 10**12),
        ("1KiB", 2**10),
        ("1MiB", 2**20),
        ("1GiB", 2**30),
        ("1TiB", 2**40),
        (" 0.5 kib ", 512),
    ],
)
def test_every_size_unit(text, size) -> None:
    assert parse_size(text) == size


def _model_file(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({f"w{i}": torch.full((4,), float(i)) for i in range(3)}, directory / name)
    return directory / name


@pytest.mark.parametrize(
    ("name", "dcp_name"),
    [(layout.MODEL_SAFETENSORS, layout.MODEL_DCP_DIR), (layout.ADAPTER_SAFETENSORS, layout.ADAPTER_DCP_DIR)],
)
def test_to_dcp_writes_beside_the_file_under_its_default_name(tmp_path, monkeypatch, name, dcp_name) -> None:
    source = _model_file(tmp_path / "model", name)
    result = convert_safetensors_to_dcp(source)
    assert result.files == (str(tmp_path / "model" / dcp_name),)
    assert sorted(os.listdir(tmp_path / "model")) == sorted([name, dcp_name])
    monkeypatch.chdir(tmp_path)  # a bare relative output name: its temporary directory is beside it too
    convert_safetensors_to_dcp(source, "bare")
    assert sorted(os.listdir(tmp_path)) == ["bare", "model"]


def test_an_overwrite_with_fewer_shards_removes_the_stale_ones(tmp_path) -> None:
    source = _model_file(tmp_path / "src", layout.MODEL_SAFETENSORS)
    convert_safetensors_to_dcp(source)
    dcp_dir = tmp_path / "src" / layout.MODEL_DCP_DIR
    out = tmp_path / "out"
    convert_dcp_to_safetensors(dcp_dir, out, max_shard_size=16)  # one 16-byte tensor per shard
    assert len([n for n in os.listdir(out) if n.startswith("model-")]) == 3
    convert_dcp_to_safetensors(dcp_dir, out, max_shard_size=32, overwrite=True)
    assert sorted(os.listdir(out)) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        layout.MODEL_INDEX,
    ]


def test_an_output_inside_the_input_is_refused(tmp_path) -> None:
    source = _model_file(tmp_path / "model", layout.MODEL_SAFETENSORS)
    with pytest.raises(CheckpointError, match=f"the input {source} lies inside {tmp_path / 'model'}"):
        convert_safetensors_to_dcp(source, tmp_path / "model", overwrite=True)
    assert sorted(os.listdir(tmp_path / "model")) == [layout.MODEL_SAFETENSORS]
