"""open_checkpoint and load_model_state_dict on single-process checkpoints of every weight format."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError, UnsafePickleError
from ckpt_tools.state.processor_state import ProcessorState
from helpers.pickle_payload import malicious_dcp_metadata
from helpers.run_outputs import model_file, saved_model
from helpers.tiny_run import make_run, save, train, training_step


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """output_dir/checkpoints/000003 in format safetensors_dcp, with a preprocessor; and the model."""
    root = tmp_path_factory.mktemp("loading")
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 1)
    processors = {
        layout.POSTPROCESSOR: ProcessorState(
            {"name": "unnormalize"}, [{"std": torch.full((3,), 2.0)}, {}, {"idx": torch.arange(4)}]
        )
    }
    save(
        root / "checkpoints",
        3,
        model,
        optimizer,
        scheduler,
        ts=training_step(3, "safetensors_dcp"),
        processors=processors,
    )
    return root, model.state_dict(), processors


@pytest.mark.parametrize("where", ["output_dir", "step", "last", "pretrained_model", "file_url"])
def test_open_checkpoint_accepts_every_entry_point(run_dir, where):
    root, _, _ = run_dir
    step = root / "checkpoints" / "000003"
    path = {
        "output_dir": root,
        "step": step,
        "last": root / "checkpoints" / "last",
        "pretrained_model": step / "pretrained_model",
        "file_url": f"file://{step}",
    }[where]
    checkpoint = ckpt_tools.open_checkpoint(path)
    assert checkpoint.formats == ("safetensors", "dcp")
    assert checkpoint.model_dir.endswith("000003/pretrained_model")
    assert checkpoint.training_step() == training_step(3, "safetensors_dcp")
    assert checkpoint.policy_config() == {"type": "mlp", "hidden": 7}
    assert checkpoint.train_config() == {"steps": 10, "seed": 0}


@pytest.mark.parametrize("source", ["safetensors", "dcp"])
def test_full_state_dict_is_bit_identical(run_dir, tmp_path, source):
    root, expected, _ = run_dir
    model_dir = tmp_path / "pretrained_model"
    shutil.copytree(saved_model(root, 3), model_dir)
    if source == "dcp":
        os.remove(model_dir / "model.safetensors")
    loaded = ckpt_tools.load_model_state_dict(model_dir)
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in expected.items())


def test_dtype_casts_floating_tensors_only(run_dir):
    root, expected, _ = run_dir
    loaded = ckpt_tools.load_model_state_dict(root, dtype=torch.bfloat16)
    assert loaded["0.weight"].dtype == torch.bfloat16
    assert torch.equal(loaded["0.weight"], expected["0.weight"].to(torch.bfloat16))
    assert loaded["calls"].dtype == torch.int64


def test_sharded_safetensors_with_index(run_dir, tmp_path):
    _, expected, _ = run_dir
    names = sorted(expected)
    shards = {layout.sharded_model_name(1, 2): names[:2], layout.sharded_model_name(2, 2): names[2:]}
    for shard, keys in shards.items():
        save_file({k: expected[k] for k in keys}, tmp_path / shard)
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (tmp_path / layout.MODEL_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    checkpoint = ckpt_tools.open_checkpoint(tmp_path)
    assert (checkpoint.step_dir, checkpoint.formats) == (None, ("sharded safetensors",))
    loaded = ckpt_tools.load_model_state_dict(tmp_path)
    assert all(torch.equal(loaded[k], v) for k, v in expected.items())

    weight_map["extra.weight"] = layout.sharded_model_name(2, 2)
    (tmp_path / layout.MODEL_INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CorruptCheckpointError, match=r"extra\.weight"):
        ckpt_tools.load_model_state_dict(tmp_path)


def test_processors_round_trip(run_dir):
    root, _, saved = run_dir
    loaded = ckpt_tools.load_processors(root)
    assert loaded.keys() == {layout.POSTPROCESSOR}
    processor = loaded[layout.POSTPROCESSOR]
    assert processor.config == {"name": "unnormalize"}
    expected = saved[layout.POSTPROCESSOR].step_tensors
    assert len(processor.step_tensors) == 3
    for got, want in zip(processor.step_tensors, expected, strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_bare_model_dir_has_no_training_step(run_dir, tmp_path):
    root, _, _ = run_dir
    shutil.copy(model_file(root, 3), tmp_path)
    checkpoint = ckpt_tools.open_checkpoint(tmp_path)
    with pytest.raises(NotACheckpointError, match="training_state"):
        checkpoint.training_step()


def test_directory_without_weights_is_not_a_checkpoint(tmp_path):
    with pytest.raises(NotACheckpointError, match="no model weights"):
        ckpt_tools.open_checkpoint(tmp_path)


def test_crafted_dcp_metadata_is_refused_before_torch_unpickles_it(run_dir, tmp_path):
    root, _, _ = run_dir
    model_dir = tmp_path / "pretrained_model"
    shutil.copytree(
        model_file(root, 3, "pytorch_model_fsdp_0"),
        model_dir / "pytorch_model_fsdp_0",
    )
    target = tmp_path / "payload_ran"
    (model_dir / "pytorch_model_fsdp_0" / ".metadata").write_bytes(malicious_dcp_metadata(target))
    with pytest.raises(UnsafePickleError):
        ckpt_tools.load_model_state_dict(model_dir)
    assert not target.exists()
