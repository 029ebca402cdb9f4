"""`ckpt convert`: DCP from real FSDP2/HSDP gloo runs -> safetensors, bit for bit, and back.

One torchrun launch per world size (1, 2, 4) writes every DCP layout the tests convert
(`tests/distributed/scripts/convert_make_dcp.py`), each next to the gathered full state dict.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ckpt_tools import convert_dcp_to_safetensors, convert_safetensors_to_dcp, layout
from ckpt_tools.errors import CheckpointNotFoundError, NotACheckpointError, OutputExistsError
from helpers.launch import run_torchrun

SCRIPT = Path(__file__).parents[1] / "distributed" / "scripts" / "convert_make_dcp.py"

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="session")
def dcp_runs(tmp_path_factory: pytest.TempPathFactory):
    """world size -> directory of DCP checkpoints written by that many gloo ranks (launched on demand)."""
    cache: dict[int, Path] = {}

    def get(world: int) -> Path:
        if world not in cache:
            out = tmp_path_factory.mktemp(f"dcp_w{world}")
            run_torchrun(SCRIPT, world, str(out), timeout=240)
            cache[world] = out
        return cache[world]

    return get


def _reference(directory: Path) -> dict[str, torch.Tensor]:
    return torch.load(directory / "reference.pt", weights_only=True)


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fsdp2_dcp_converts_bit_exact(dcp_runs, world: int, tmp_path: Path) -> None:
    source = dcp_runs(world) / "fsdp"
    result = convert_dcp_to_safetensors(source, tmp_path)
    assert result.files == (str(tmp_path / layout.MODEL_SAFETENSORS),)
    _assert_equal(load_file(result.files[0]), _reference(source))
    with safe_open(result.files[0], "pt") as handle:
        assert handle.metadata() == {"format": "pt"}


def test_hsdp_dcp_converts_bit_exact(dcp_runs, tmp_path: Path) -> None:
    source = dcp_runs(4) / "hsdp"
    result = convert_dcp_to_safetensors(source, tmp_path)
    _assert_equal(load_file(result.files[0]), _reference(source))


def test_inner_dimension_shards_are_assembled(dcp_runs, tmp_path: Path) -> None:
    source = dcp_runs(2) / "colshard"
    calls: list[tuple[int, int]] = []
    result = convert_dcp_to_safetensors(
        source, tmp_path, progress=lambda done, total: calls.append((done, total))
    )
    _assert_equal(load_file(result.files[0]), _reference(source))
    # progress counts the assembled tensors too: it climbs from 0 to every byte written
    assert calls[0] == (0, result.total_bytes) and calls[-1] == (result.total_bytes, result.total_bytes)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_bf16_export_casts_floats_only(dcp_runs, tmp_path: Path) -> None:
    source = dcp_runs(2) / "fsdp"
    result = convert_dcp_to_safetensors(source, tmp_path, dtype="bf16")
    want = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in _reference(source).items()}
    got = load_file(result.files[0])
    _assert_equal(got, want)
    assert got["counts"].dtype == torch.int64
    assert result.total_bytes == sum(t.numel() * t.element_size() for t in want.values())


def test_sharded_output_follows_hub_index_conventions(
    dcp_runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import load_torch_model

    source = dcp_runs(2) / "fsdp"
    result = convert_dcp_to_safetensors(source, tmp_path, max_shard_size="200B")
    assert len(result.files) > 2
    assert [Path(f).name for f in result.files] == [
        layout.sharded_model_name(i + 1, len(result.files)) for i in range(len(result.files))
    ]
    index = json.loads((tmp_path / layout.MODEL_INDEX).read_text())
    assert set(index["weight_map"].values()) == {Path(f).name for f in result.files}
    merged: dict[str, torch.Tensor] = {}
    for file in result.files:
        with safe_open(file, "pt") as handle:
            merged.update({key: handle.get_tensor(key) for key in handle.keys()})  # noqa: SIM118
    reference = _reference(source)
    _assert_equal(merged, reference)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in reference.values())

    import importlib.util

    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the script imports its sibling clean_exit
    spec = importlib.util.spec_from_file_location("convert_make_dcp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Tiny()
    load_torch_model(model, tmp_path, strict=True)
    _assert_equal(dict(model.state_dict()), reference)


def test_combined_checkpoint_yields_model_keys_only(dcp_runs, tmp_path: Path) -> None:
    source = dcp_runs(2) / "combined"
    result = convert_dcp_to_safetensors(source, tmp_path)
    got = load_file(result.files[0])
    _assert_equal(got, _reference(source))
    assert not any("exp_avg" in name or name.startswith("optim") for name in got)


def test_accelerate_save_state_layout_from_model_dir(dcp_runs, tmp_path: Path) -> None:
    """accelerate writes `{"model": state_dict}` into `pytorch_model_fsdp_0/`: the output lands beside
    it, under the model's own names, equal to accelerate's own merge."""
    from accelerate.utils import merge_fsdp_weights

    model_dir = tmp_path / "pretrained_model"
    import shutil

    shutil.copytree(dcp_runs(2) / "accelerate" / "pretrained_model", model_dir)
    result = convert_dcp_to_safetensors(model_dir)
    assert result.files == (str(model_dir / layout.MODEL_SAFETENSORS),)
    got = load_file(result.files[0])
    _assert_equal(got, _reference(model_dir))
    merge_fsdp_weights(
        str(model_dir / layout.MODEL_DCP_DIR), str(tmp_path / "accel"), safe_serialization=True
    )
    _assert_equal(got, load_file(tmp_path / "accel" / layout.MODEL_SAFETENSORS))


def test_peft_adapter_shards_become_adapter_model(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model_dir = tmp_path / "pretrained_model"
    adapter = {
        "base_model.model.q.lora_A.weight": torch.randn(4, 8),
        "base_model.model.q.lora_B.weight": torch.zeros(8, 4),
    }
    dcp.save(adapter, checkpoint_id=str(model_dir / layout.ADAPTER_DCP_DIR), no_dist=True)
    (model_dir / layout.ADAPTER_CONFIG).write_text("{}")
    result = convert_dcp_to_safetensors(tmp_path)
    assert result.files == (str(model_dir / layout.ADAPTER_SAFETENSORS),)
    _assert_equal(load_file(result.files[0]), adapter)


def test_refuses_overwrite_then_replaces_and_drops_stale_shards(dcp_runs, tmp_path: Path) -> None:
    source = dcp_runs(2) / "fsdp"
    sharded = convert_dcp_to_safetensors(source, tmp_path, max_shard_size="200B")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        convert_dcp_to_safetensors(source, tmp_path)
    convert_dcp_to_safetensors(source, tmp_path, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == [layout.MODEL_SAFETENSORS]
    assert all(not Path(f).exists() for f in sharded.files)


def test_interrupted_conversion_leaves_nothing_half_written(dcp_runs, tmp_path: Path) -> None:
    source = dcp_runs(2) / "fsdp"
    before = sorted(os.listdir(source))

    def interrupt(done: int, total: int) -> None:
        if done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_dcp_to_safetensors(source, tmp_path, max_shard_size="200B", progress=interrupt)
    assert os.listdir(tmp_path) == []
    assert sorted(os.listdir(source)) == before


def test_delete_dcp_removes_shards_after_a_checked_write(dcp_runs, tmp_path: Path) -> None:
    import shutil

    source = tmp_path / "dcp"
    shutil.copytree(dcp_runs(2) / "fsdp", source)
    reference = _reference(source)
    result = convert_dcp_to_safetensors(source, tmp_path / "out", delete_dcp=True)
    assert result.deleted_source
    assert not source.exists()
    _assert_equal(load_file(result.files[0]), reference)


def test_safetensors_to_dcp_round_trip(dcp_runs, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    reference = _reference(dcp_runs(2) / "fsdp")
    convert_dcp_to_safetensors(dcp_runs(2) / "fsdp", tmp_path, max_shard_size="300B")
    result = convert_safetensors_to_dcp(tmp_path)
    assert result.files == (str(tmp_path / layout.MODEL_DCP_DIR),)
    loaded = {k: torch.empty_like(v) for k, v in reference.items()}
    dcp.load(loaded, checkpoint_id=result.files[0], no_dist=True)
    _assert_equal(loaded, reference)
    with pytest.raises(OutputExistsError):
        convert_safetensors_to_dcp(tmp_path)


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError):
        convert_dcp_to_safetensors(tmp_path / "missing")
    with pytest.raises(NotACheckpointError, match="no DCP shards"):
        convert_dcp_to_safetensors(tmp_path)


def test_fsspec_memory_store(dcp_runs) -> None:
    import fsspec
    from safetensors.torch import load

    fs = fsspec.filesystem("memory")
    source = dcp_runs(2) / "fsdp"
    for file in source.iterdir():
        fs.pipe(f"/convert-test/pretrained_model/{layout.MODEL_DCP_DIR}/{file.name}", file.read_bytes())
    result = convert_dcp_to_safetensors("memory://convert-test")
    assert result.files == (f"memory://convert-test/pretrained_model/{layout.MODEL_SAFETENSORS}",)
    _assert_equal(
        load(fs.cat(f"/convert-test/pretrained_model/{layout.MODEL_SAFETENSORS}")), _reference(source)
    )
    fs.rm("/convert-test", recursive=True)
