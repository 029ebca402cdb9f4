"""Gathered safetensors weights into a sharded (FSDP2) model, in this process: a one-rank gloo group is
enough for DTensor parameters, so the block-by-block load and its refusals run without a launch.

One file, a sharded index (model.safetensors.index.json with two shards) and DCP shards load bit for bit, the
replicated integer buffer included; a checkpoint lacking a tensor or holding one of another shape is
refused with one line naming it, before any parameter changes. A non-sharded run's
optimizer_state.safetensors goes into the sharded optimizer the same way, with the same refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import ckpt_tools
from ckpt_tools import layout
from helpers.tiny_run import make_run, save, tiny_model, train, training_step


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A non-sharded checkpoint (model.safetensors) and the weights it holds."""
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    step = Path(save(tmp_path / "checkpoints", 2, model, optimizer, scheduler))
    return step, {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _sharded_model() -> torch.nn.Module:
    torch.manual_seed(5)
    model = tiny_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    assert any(isinstance(p, DTensor) for p in model.parameters())
    return model


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).clone() for k, v in state.items()}


def _model_file(step: Path) -> Path:
    return step / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS


def test_one_file_loads_into_shards_bit_for_bit(one_rank, saved) -> None:
    step, want = saved
    model = _sharded_model()
    ckpt_tools.training.load_training_state(step, model=model)
    got = _weights(model)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_a_sharded_index_loads_into_shards_bit_for_bit(one_rank, saved) -> None:
    step, want = saved
    whole = load_file(_model_file(step))
    _model_file(step).unlink()
    names = sorted(whole)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    model_dir = step / layout.PRETRAINED_MODEL_DIR
    for file_name, keys in shards.items():
        save_file({k: whole[k] for k in keys}, model_dir / file_name, {"format": "pt"})
    weight_map = {k: file_name for file_name, keys in shards.items() for k in keys}
    (model_dir / layout.MODEL_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    model = _sharded_model()
    ckpt_tools.training.load_training_state(step, model=model)
    got = _weights(model)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_a_dcp_checkpoint_loads_into_shards_bit_for_bit(one_rank, tmp_path) -> None:
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    step = Path(save(tmp_path / "dcp", 2, model, optimizer, scheduler, ts=training_step(2, "dcp")))
    sharded = _sharded_model()
    ckpt_tools.training.load_training_state(step, model=sharded)
    got = _weights(sharded)
    for name, tensor in model.state_dict().items():
        assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            "drop",
            "{file} lacks 1 of the model's tensors (first: 2.weight); resume from a checkpoint of this model",
        ),
        (
            "reshape",
            "{file}: 2.weight has shape [3, 6], the model's is [3, 7]; resume from a checkpoint of this model",
        ),
    ],
)
def test_a_tensor_missing_or_of_another_shape_is_refused(one_rank, saved, change, message) -> None:
    step, _ = saved
    tensors = load_file(_model_file(step))
    if change == "drop":
        del tensors["2.weight"]
    else:
        tensors["2.weight"] = tensors["2.weight"][:, :6].contiguous()
    save_file(tensors, _model_file(step), {"format": "pt"})
    model = _sharded_model()
    before = _weights(model)
    with pytest.raises(ckpt_tools.CorruptCheckpointError) as refused:
        ckpt_tools.training.load_training_state(step, model=model)
    assert str(refused.value) == message.format(file=_model_file(step))
    for name, tensor in _weights(model).items():
        assert torch.equal(tensor, before[name]), name


def _sharded_run() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _sharded_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    return model, optimizer


def test_a_non_sharded_optimizer_state_loads_into_shards_bit_for_bit(one_rank, tmp_path) -> None:
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    step = Path(save(tmp_path / "checkpoints", 2, model, optimizer, scheduler))
    sharded, sharded_optimizer = _sharded_run()
    ckpt_tools.training.load_training_state(step, model=sharded, optimizer=sharded_optimizer)
    want = optimizer.state_dict()
    got = sharded_optimizer.state_dict()
    assert got["param_groups"] == want["param_groups"]  # betas stay a tuple
    assert isinstance(got["param_groups"][0]["betas"], tuple)
    for index, entry in want["state"].items():
        for key, value in entry.items():
            loaded = got["state"][index][key]
            loaded = loaded.full_tensor() if isinstance(loaded, DTensor) else loaded
            assert loaded.dtype == value.dtype and torch.equal(loaded, value), (index, key)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("drop", "{file} lacks state/2.weight/exp_avg (this optimizer's is [3, 7])"),
        ("reshape", "{file} has shape [3, 6] for state/2.weight/exp_avg (this optimizer's is [3, 7])"),
    ],
)
def test_an_optimizer_moment_missing_or_of_another_shape_is_refused(one_rank, saved, change, message) -> None:
    step, _ = saved
    path = step / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_SAFETENSORS
    tensors = load_file(path)
    if change == "drop":
        del tensors["state/2.weight/exp_avg"]
    else:
        tensors["state/2.weight/exp_avg"] = tensors["state/2.weight/exp_avg"][:, :6].contiguous()
    save_file(tensors, path)
    model, optimizer = _sharded_run()
    with pytest.raises(ckpt_tools.CorruptCheckpointError) as refused:
        ckpt_tools.training.load_training_state(step, model=model, optimizer=optimizer)
    assert str(refused.value) == message.format(file=path) + (
        "; resume with the model and optimizer settings the checkpoint was trained with"
    )
