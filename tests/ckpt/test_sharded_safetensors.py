"""Hugging Face style sharded safetensors (issue 32, item 4): `model-0000k-of-0000n.safetensors` and
`model.safetensors.index.json`.

The split is huggingface_hub's own; a sharded save holds the files huggingface_hub writes for the same
state dict byte for byte, and the single-file save's tensors bit for bit; a set huggingface_hub wrote
loads everywhere (whole, into FSDP2 shards, verify, inspect); each bad set is one line; `ckpt convert
--max-shard-size` writes a set that verify and inspect accept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import save_torch_state_dict, split_torch_state_dict_into_shards
from report_fixtures import run_ckpt
from safetensors.torch import load_file
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.files.sharded_safetensors import plan_shards
from ckpt_tools.tensors.tensor_io import tensor_spec
from helpers.tiny_run import make_run, save, tiny_model, train

SHARD = 100  # bytes: tiny_model's 252 bytes of tensors in three shards, its 112-byte weight alone


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return {
        "a": torch.randn(10),  # 40 bytes
        "big": torch.randn(40),  # 160 bytes: above the limit, a shard of its own
        "b": torch.randn(5).to(torch.bfloat16),
        "c": torch.arange(9),  # int64, 72 bytes
        "d": torch.randn(3, 3),
    }


@pytest.mark.parametrize("limit", [50, 100, 1000])
def test_the_split_is_huggingface_hubs(limit: int) -> None:
    state = _state()
    ours = plan_shards([tensor_spec(n, t) for n, t in state.items()], limit)
    theirs = split_torch_state_dict_into_shards(state, max_shard_size=limit).filename_to_tensors
    assert {name: sorted(s.name for s in specs) for name, specs in ours} == {
        name: sorted(names) for name, names in theirs.items()
    }


@pytest.fixture
def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    return model, optimizer, scheduler


def test_a_sharded_save_writes_huggingface_hubs_files(trained, tmp_path: Path) -> None:
    model, optimizer, scheduler = trained
    ema = {name: param.detach() + 1 for name, param in model.named_parameters()}
    step = Path(
        save(
            tmp_path / "sharded",
            2,
            model,
            optimizer,
            scheduler,
            shard_size=f"{SHARD}B",
            extra_weights={"ema": ema},
        )
    )
    single = Path(save(tmp_path / "single", 2, model, optimizer, scheduler))
    hub = tmp_path / "hub"
    hub.mkdir()
    save_torch_state_dict(model.state_dict(), hub, max_shard_size=SHARD)
    model_dir = step / layout.PRETRAINED_MODEL_DIR
    written = sorted(p.name for p in model_dir.glob("model*"))
    assert written == sorted(p.name for p in hub.iterdir()) and len(written) == 4, written
    for name in written:
        if name == layout.MODEL_INDEX:
            assert json.loads((model_dir / name).read_text()) == json.loads((hub / name).read_text())
        else:
            assert (model_dir / name).read_bytes() == (hub / name).read_bytes(), name
    whole = load_file(single / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS)
    loaded = ckpt_tools.load_model_state_dict(step)
    assert loaded.keys() == whole.keys()
    assert all(torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in whole.items())
    manifest = json.loads((step / layout.MANIFEST).read_text())["files"]
    assert {f"{layout.PRETRAINED_MODEL_DIR}/{name}" for name in written} <= set(manifest)
    assert ckpt_tools.verify_checkpoint(step, deep=True).ok
    assert load_file(model_dir / layout.EMA_SAFETENSORS).keys() == ema.keys()  # the EMA stays one file


def _sharded_model() -> torch.nn.Module:
    torch.manual_seed(5)
    model = tiny_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    return model


def test_a_set_huggingface_hub_wrote_loads_and_verifies(one_rank, trained, tmp_path: Path) -> None:
    model, _, _ = trained
    want = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    save_torch_state_dict(model.state_dict(), tmp_path, max_shard_size=SHARD)
    loaded = ckpt_tools.load_model_state_dict(tmp_path)
    assert all(torch.equal(loaded[k], v) for k, v in want.items()) and loaded.keys() == want.keys()
    sharded = _sharded_model()
    ckpt_tools.training.load_model_weights(tmp_path, sharded)
    for name, value in sharded.state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        assert torch.equal(full, want[name]), name
    assert run_ckpt("verify", tmp_path).exit_code == 0
    inspected = run_ckpt("inspect", tmp_path, "--json")
    assert inspected.exit_code == 0 and "sharded safetensors" in inspected.stdout


def _missing_shard(model_dir: Path) -> str:
    (model_dir / "model-00002-of-00003.safetensors").unlink()
    return f"{model_dir / layout.MODEL_INDEX} names model-00002-of-00003.safetensors, which is missing"


def _truncated_shard(model_dir: Path) -> str:
    shard = model_dir / "model-00003-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    return f"{shard}: "


def _tensor_not_in_its_shard(model_dir: Path) -> str:
    index = json.loads((model_dir / layout.MODEL_INDEX).read_text())
    index["weight_map"]["0.bias"] = "model-00001-of-00003.safetensors"
    (model_dir / layout.MODEL_INDEX).write_text(json.dumps(index))
    return f"{model_dir / layout.MODEL_INDEX} puts 0.bias in model-00001-of-00003.safetensors, which does not hold it"


@pytest.mark.parametrize("damage", [_missing_shard, _truncated_shard, _tensor_not_in_its_shard])
def test_each_bad_set_is_one_line(one_rank, trained, tmp_path: Path, damage) -> None:
    model, _, _ = trained
    save_torch_state_dict(model.state_dict(), tmp_path, max_shard_size=SHARD)
    start = damage(tmp_path)
    for load in (
        ckpt_tools.load_model_state_dict,
        lambda p: ckpt_tools.training.load_model_weights(p, _sharded_model()),
    ):
        with pytest.raises(ckpt_tools.CheckpointError) as refused:
            load(tmp_path)
        assert str(refused.value).startswith(start) and "\n" not in str(refused.value)
    result = run_ckpt("verify", tmp_path)
    assert result.exit_code == 1


def test_convert_writes_a_set_verify_and_inspect_accept(trained, tmp_path: Path) -> None:
    model, _, _ = trained
    want = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    dcp_dir = tmp_path / "dcp"
    dcp_save(dict(want), checkpoint_id=str(dcp_dir), no_dist=True)
    out = tmp_path / "out"
    assert run_ckpt("convert", dcp_dir, "--max-shard-size", f"{SHARD}B", "--output", out).exit_code == 0
    assert {p.name for p in out.iterdir()} == {
        layout.MODEL_INDEX,
        *(layout.sharded_model_name(i, 3) for i in (1, 2, 3)),
    }
    loaded = ckpt_tools.load_model_state_dict(out)
    assert all(torch.equal(loaded[k], v) for k, v in want.items()) and loaded.keys() == want.keys()
    assert run_ckpt("verify", out).exit_code == 0
    assert run_ckpt("inspect", out).exit_code == 0
