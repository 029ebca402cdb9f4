"""Single-process saves and resumes: the files the format names, and an exact round trip."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.errors import LegacyCheckpointError
from ckpt_tools.files import storage
from ckpt_tools.state import optim_codec, rng
from ckpt_tools.state import save as save_module
from ckpt_tools.state.processor_state import ProcessorState
from helpers.run_outputs import saved_model
from helpers.tiny_run import (
    assert_same_optimizer_state,
    assert_same_tensors,
    make_run,
    save,
    tiny_model,
    train,
    training_step,
)


@pytest.fixture
def trained():
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    return model, optimizer, scheduler


def test_save_writes_the_files_of_the_format(tmp_path, trained):
    model, optimizer, scheduler = trained
    processors = {
        layout.PREPROCESSOR: ProcessorState({"steps": ["normalize"]}, [{"mean": torch.arange(3.0)}]),
    }
    final = save(tmp_path / "checkpoints", 5, model, optimizer, scheduler, processors=processors)

    assert final == str(tmp_path / "checkpoints" / "000005")
    assert os.readlink(tmp_path / "checkpoints" / "last") == "000005"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000005", "last"]  # no .tmp- leftovers
    model_dir = saved_model(tmp_path, 5)
    assert sorted(os.listdir(model_dir)) == [
        "config.json",
        "model.safetensors",
        "policy_preprocessor.json",
        "policy_preprocessor_step_0.safetensors",
        "train_config.json",
    ]
    assert sorted(os.listdir(model_dir.parent / "training_state")) == [
        "optimizer_param_groups.json",
        "optimizer_state.safetensors",
        "rng_state.safetensors",
        "scheduler_state.json",
        "training_step.json",
    ]
    weights = load_file(model_dir / "model.safetensors")
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    groups = json.loads((model_dir.parent / "training_state" / "optimizer_param_groups.json").read_text())
    assert groups[0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert ckpt_tools.read_training_step(tmp_path) == training_step(5)


def test_resume_restores_model_optimizer_and_scheduler_exactly(tmp_path, trained):
    model, optimizer, scheduler = trained
    save(tmp_path / "checkpoints", 2, model, optimizer, scheduler)
    resumed = make_run(seed=1)  # different initial weights: everything must come from the files

    ckpt_tools.training.load_training_state(
        tmp_path, model=resumed[0], optimizer=resumed[1], scheduler=resumed[2]
    )

    assert_same_tensors(model.state_dict(), resumed[0].state_dict())
    assert_same_optimizer_state(optimizer.state_dict(), resumed[1].state_dict())
    assert scheduler.state_dict() == resumed[2].state_dict()
    train(model, optimizer, scheduler, 2)
    train(*resumed, 2)
    assert_same_tensors(dict(model.named_parameters()), dict(resumed[0].named_parameters()))


def test_optimizer_safetensors_round_trips_a_state_dict(tmp_path, trained):
    model, optimizer, scheduler = trained
    save(tmp_path, 2, model, optimizer, scheduler)
    _, fresh_optimizer, _ = make_run()
    osd = optim_codec.read_optimizer_safetensors(str(tmp_path / "000002" / "training_state"), fresh_optimizer)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    expected = get_optimizer_state_dict(model, optimizer)
    assert osd["param_groups"] == expected["param_groups"]
    assert isinstance(osd["param_groups"][0]["betas"], tuple)
    for fqn, entry in expected["state"].items():
        assert all(torch.equal(v, osd["state"][fqn][k]) for k, v in entry.items())


def test_scaler_state_round_trips(tmp_path, trained):
    model, optimizer, scheduler = trained
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    scaler.scale(torch.ones(()))  # the scale exists from the first scale() on
    scaler.update(512.0)
    save(tmp_path, 3, model, optimizer, scheduler, scaler=scaler)
    assert (
        json.loads((tmp_path / "000003" / "training_state" / "scaler_state.json").read_text())["scale"]
        == 512.0
    )
    restored = torch.amp.GradScaler("cpu")
    ckpt_tools.training.load_training_state(tmp_path / "000003", model=tiny_model(), scaler=restored)
    assert restored.state_dict() == scaler.state_dict()


@pytest.mark.parametrize("checkpoint_format", ["dcp", "safetensors_dcp"])
def test_dcp_formats_from_one_process(tmp_path, trained, checkpoint_format):
    model, optimizer, scheduler = trained
    save(tmp_path, 4, model, optimizer, scheduler, ts=training_step(4, checkpoint_format))
    model_dir = tmp_path / "000004" / "pretrained_model"
    assert (model_dir / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert (model_dir / "model.safetensors").exists() == (checkpoint_format == "safetensors_dcp")
    resumed = make_run(seed=3)
    ckpt_tools.training.load_training_state(tmp_path / "last", model=resumed[0], optimizer=resumed[1])
    assert_same_tensors(model.state_dict(), resumed[0].state_dict())


def test_rng_state_restores_every_generator(tmp_path):
    storage.makedirs(tmp_path / "000001" / "training_state")
    (tmp_path / "000001" / "pretrained_model").mkdir()
    rng.save_rng_state(tmp_path / "000001", rank=0, world_size=1)
    expected = (random.random(), np.random.rand(), torch.rand(3))

    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    rng.load_rng_state(tmp_path / "000001", rank=0, world_size=1)

    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])


def test_extra_ranks_get_distinct_reproducible_rng_streams(tmp_path):
    storage.makedirs(tmp_path / "000001" / "training_state")
    (tmp_path / "000001" / "pretrained_model").mkdir()
    rng.save_rng_state(tmp_path / "000001", rank=0, world_size=1)

    def draws(rank: int) -> tuple[float, float, torch.Tensor]:
        rng.load_rng_state(tmp_path / "000001", rank=rank, world_size=3)
        return random.random(), np.random.rand(), torch.rand(2)

    rank0, rank1, rank1_again, rank2 = draws(0), draws(1), draws(1), draws(2)
    assert rank1[:2] == rank1_again[:2] and torch.equal(rank1[2], rank1_again[2])
    assert len({rank0[0], rank1[0], rank2[0]}) == 3
    assert not torch.equal(rank0[2], rank1[2]) and not torch.equal(rank1[2], rank2[2])


def test_crash_mid_save_leaves_last_on_the_previous_step(tmp_path, trained, monkeypatch):
    model, optimizer, scheduler = trained
    save(tmp_path, 1, model, optimizer, scheduler)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(save_module, "_write_side_files", crash)
    with pytest.raises(ckpt_tools.training.SaveFailedError) as failed:
        save(tmp_path, 2, model, optimizer, scheduler)
    assert str(failed.value) == "saving checkpoint step 2 failed on the main rank: OSError: disk full"
    assert os.readlink(tmp_path / "last") == "000001"
    assert not (tmp_path / "000002").exists()
    assert (tmp_path / ".tmp-000002" / "pretrained_model" / "model.safetensors").exists()  # partial
    assert ckpt_tools.latest_step_dir(tmp_path) == str(tmp_path / "000001")

    monkeypatch.undo()
    save(tmp_path, 2, model, optimizer, scheduler)  # the next save clears the leftovers
    assert sorted(os.listdir(tmp_path)) == ["000001", "000002", "last"]
    assert ckpt_tools.read_training_step(tmp_path / "last").step == 2


def test_saving_the_same_step_again_replaces_it(tmp_path, trained):
    model, optimizer, scheduler = trained
    save(tmp_path, 2, model, optimizer, scheduler)
    train(model, optimizer, scheduler, 1)
    save(tmp_path, 2, model, optimizer, scheduler)
    assert sorted(os.listdir(tmp_path)) == ["000002", "last"]
    loaded = ckpt_tools.load_model_state_dict(tmp_path / "last")
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("checkpoint_format", ["safetensors", "dcp"])
def test_memory_store_gets_a_text_last_pointer(checkpoint_format):
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 1)
    root = "memory://state-single/run/checkpoints"
    final = save(root, 7, model, optimizer, scheduler, ts=training_step(7, checkpoint_format))

    assert final == f"{root}/000007"
    assert storage.read_text(f"{root}/last").strip() == "000007"
    assert ckpt_tools.latest_step_dir("memory://state-single/run") == final
    loaded = ckpt_tools.load_model_state_dict("memory://state-single/run")
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    resumed = make_run(seed=5)
    ckpt_tools.training.load_training_state(f"{root}/last", model=resumed[0], optimizer=resumed[1])
    assert_same_optimizer_state(optimizer.state_dict(), resumed[1].state_dict())
    storage.remove_tree("memory://state-single")


def test_sharded_run_without_dcp_optimizer_is_refused_as_legacy(tmp_path, trained):
    model, optimizer, scheduler = trained
    final = save(tmp_path, 2, model, optimizer, scheduler)
    step_file = os.path.join(final, "training_state", "training_step.json")
    with open(step_file) as handle:
        data = json.load(handle)
    data.update(dp_world_size=2, topology={**data["topology"], "dp_shard": 2})
    with open(step_file, "w") as handle:
        json.dump(data, handle)
    with pytest.raises(LegacyCheckpointError, match="optimizer_0"):
        ckpt_tools.training.load_training_state(final, model=tiny_model(), optimizer=make_run()[1])


def test_unknown_processor_name_is_refused_before_writing(tmp_path, trained):
    model, optimizer, scheduler = trained
    with pytest.raises(ValueError, match="policy_preprocessor"):
        save(tmp_path, 2, model, optimizer, scheduler, processors={"tokenizer": ProcessorState({}, [])})
    assert not tmp_path.joinpath(".tmp-000002").exists()


def test_a_failed_shard_write_is_one_line_naming_the_rank_and_the_cause(tmp_path, trained, monkeypatch):
    """torch's DCP turns a rank's failed write into a multi-line CheckpointException; the save reports
    it as one line: the ranks, the cause's type and its first 200 characters on one line."""
    model, optimizer, scheduler = trained
    save(tmp_path, 1, model, optimizer, scheduler, ts=training_step(1, "dcp"))
    cause = "no space\n  left on device " * 12  # 2 lines each, 300 characters on one line

    def full(*args, **kwargs):
        raise OSError(cause)

    monkeypatch.setattr(torch.distributed.checkpoint.FileSystemWriter, "write_data", full)
    with pytest.raises(ckpt_tools.training.SaveFailedError) as failed:
        save(tmp_path, 2, model, optimizer, scheduler, ts=training_step(2, "dcp"))
    detail = " ".join(cause.split())[:200]
    assert len(detail) == 200
    assert str(failed.value) == (
        f"saving checkpoint step 2 failed: rank 0 could not write its shards (OSError: {detail})"
    )
    assert os.readlink(tmp_path / "last") == "000001"


def test_an_adapter_save_of_a_model_with_nothing_trainable_is_refused(tmp_path, trained):
    model, optimizer, scheduler = trained
    model.requires_grad_(False)
    message = "adapter_config was given but the model has no trainable parameters to save"
    with pytest.raises(ValueError, match=f"^{message}$"):
        save(tmp_path, 1, model, optimizer, scheduler, adapter_config={"peft_type": "LORA"})
    assert not (tmp_path / "000001").exists() and not (tmp_path / "last").exists()


def test_background_saves_on_a_one_rank_group_commit_what_they_staged(
    one_rank, tmp_path, trained, monkeypatch
):
    """Two background saves in a row on an initialized process group: the DCP part is written on a gloo
    write group (created on first use, reused after) and `finish()` commits it."""
    model, optimizer, scheduler = trained
    for step in (1, 2):
        save(tmp_path, step, model, optimizer, scheduler, ts=training_step(step, "dcp"), background=True)
        assert os.readlink(tmp_path / "last") == f"{step:06d}"
    resumed = make_run(seed=3)
    ckpt_tools.training.load_training_state(tmp_path / "last", model=resumed[0], optimizer=resumed[1])
    assert_same_tensors(model.state_dict(), resumed[0].state_dict())
