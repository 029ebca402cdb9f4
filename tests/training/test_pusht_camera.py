"""LeRobot's PushT camera, `observation.image` (no `observation.images.` prefix), is a camera here as in
LeRobot, which knows a camera by its feature's dtype: `trainer dataset info` lists it, ACT trains a
ResNet on it, and the PushT ACT that lerobot-train 0.6.1 wrote loads and acts as LeRobot's does."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import trainer
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.train_flags import TINY_LEROBOT_ACT
from trainer.cli.dataset_command import describe
from trainer.cli.parse import parse_config
from trainer.data.format import metadata as fmt
from trainer.data.sources.lerobot import _requested_cameras
from trainer.engine.plan import train
from trainer.errors import ConfigError

CAMERA = "observation.image"


def test_dataset_info_lists_the_camera(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "lerobot", "dataset_pusht_image")
    cameras = describe(root)["cameras"]
    assert list(cameras) == [CAMERA]
    assert (cameras[CAMERA]["channels"], cameras[CAMERA]["height"], cameras[CAMERA]["width"]) == (3, 96, 96)


def test_a_camera_under_another_name_is_refused_not_dropped(tmp_path: Path) -> None:
    """An image feature whose name a batch cannot carry as a camera stops the run in one line."""
    info = fmt.read_info(copy_fixture(tmp_path, "lerobot", "dataset_pusht_image"))
    feature = info.features[CAMERA]
    odd = fmt.Info(info.root, info.fps, {"observation.pixels": feature, **info.features})
    with pytest.raises(ConfigError, match=r"camera 'observation.pixels' .*rename the feature"):
        _requested_cameras(odd, ["observation.images.*"])


def test_act_trains_a_resnet_on_observation_image(tmp_path: Path, clean_accelerate) -> None:
    from accelerate.state import AcceleratorState

    root = copy_fixture(tmp_path, "lerobot", "dataset_pusht_image")
    flags = [f"--dataset.root={root}", "--policy.type=act", *TINY_LEROBOT_ACT, "--batch_size=2"]
    flags += ["--num_workers=0", "--steps=1", "--save_freq=1", f"--output_dir={tmp_path / 'run'}"]
    summary = train(parse_config(flags))
    AcceleratorState._reset_state(reset_partial_state=True)
    assert summary.steps == 1 and math.isfinite(summary.final_loss)
    trained = trainer.load_policy(str(tmp_path / "run" / "checkpoints" / "last"))
    assert trained.policy.config.input_features == ["observation.state", CAMERA]
    assert trained.policy.config.image_shapes == {CAMERA: [3, 96, 96]}
    backbone = [name for name in trained.policy.state_dict() if name.startswith("backbone.")]
    assert any(name.startswith("backbone.layer4.") for name in backbone)


def test_lerobots_pusht_act_loads_with_its_camera(tmp_path: Path) -> None:
    """lerobot_pusht_act: LeRobot's own PushT ACT checkpoint (its config, processors and tensor names;
    the 43 MB of weights regenerated here from the recorded names and shapes, seeded) loads strictly,
    with its ResNet on `observation.image`, and acts on a raw observation."""
    folder = fixture_dir("lerobot_pusht_act")
    model = tmp_path / "pretrained_model"
    shutil.copytree(folder / "pretrained_model", model)
    shapes = json.loads((folder / "tensor_shapes.json").read_text())
    generator = torch.Generator().manual_seed(0)
    weights = {
        name: torch.ones(spec["shape"])
        if name.endswith("running_var")
        else torch.randn(spec["shape"], generator=generator) * 0.02
        for name, spec in shapes.items()
    }
    save_file(weights, str(model / "model.safetensors"))
    loaded = trainer.load_policy(str(model))
    assert loaded.policy.config.image_shapes == {CAMERA: [3, 96, 96]}
    assert any(".backbone." in name for name in shapes)
    image = torch.randint(0, 256, (1, 3, 96, 96), dtype=torch.uint8, generator=generator)
    action = loaded.act({CAMERA: image, "observation.state": torch.tensor([[200.0, 300.0]])})
    assert action.shape == (1, 2) and torch.isfinite(action).all()


def test_a_camera_the_policy_does_not_read_is_named_at_start(tmp_path: Path) -> None:
    """A state-only policy on PushT: the camera it leaves out is named in the data's banner notes."""
    root = copy_fixture(tmp_path, "lerobot", "dataset_pusht_image")
    config = parse_config([f"--dataset.root={root}", "--policy.type=mlp", "--steps=1"])
    data = config.dataset.load(["observation.state"])
    assert data.notes == [
        "the policy does not read observation.image of the dataset; name them in --policy.input_features "
        "to use them"
    ]


def test_diffusion_trains_its_image_encoder_on_observation_image(tmp_path: Path, clean_accelerate) -> None:
    from accelerate.state import AcceleratorState

    root = copy_fixture(tmp_path, "lerobot", "dataset_pusht_image")
    flags = [f"--dataset.root={root}", "--policy.type=diffusion", "--policy.pretrained_backbone_weights=null"]
    flags += ["--policy.horizon=8", "--policy.n_action_steps=4", "--policy.down_dims=[8,16]"]
    flags += ["--policy.num_inference_steps=2", "--batch_size=2", "--num_workers=0", "--steps=1"]
    flags += ["--save_freq=1", f"--output_dir={tmp_path / 'run'}"]
    train(parse_config(flags))
    AcceleratorState._reset_state(reset_partial_state=True)
    trained = trainer.load_policy(str(tmp_path / "run" / "checkpoints" / "last"))
    assert trained.policy.config.input_features == ["observation.state", CAMERA]
    assert trained.policy.config.image_shapes == {CAMERA: [3, 96, 96]}
    assert any("rgb_encoder" in name for name in trained.policy.state_dict())
