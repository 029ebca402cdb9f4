"""A mixture whose members differ (data/pipeline/embodiments.py): LeRobot's video dataset (state 4,
action 2, two video cameras, 10 fps) beside a written robot (state 6, action 3, one image camera,
15 fps). SmolVLA, which takes such members (`PolicyConfig.takes_mixed_members`), trains on it and
resumes bit for bit; its loss gives the smaller robot's padded action dim exactly zero gradient; a
policy that cannot take it is refused in one line naming the member and the feature."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers.engine_run import TINY_SMOLVLA, rewound_copy, train_in
from helpers.fixtures import copy_fixture
from helpers.lerobot_data import frames, write_dataset
from trainer.cli.parse import parse_config
from trainer.config.dataset import Frames
from trainer.data.dataset import ACTION_DIM_PAD_KEY, ALL_CAMERAS, OBS_KEY, STATE_DIM_PAD_KEY, TASK_KEY
from trainer.data.pipeline.embodiments import MixedMixture
from trainer.data.sources.mixture import MixtureConfig
from trainer.errors import ConfigError
from trainer.policies import build_policy

TOP, WRIST, FRONT = (f"observation.images.{name}" for name in ("top", "wrist", "front"))
SMOLVLA = TINY_SMOLVLA
VIDEO_FRAMES = 80  # dataset_video's frames come first in the mixture's index space


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LeRobot's video dataset, the written 6/3 robot, the mixture file naming both, the backbone."""
    tmp = tmp_path_factory.mktemp("embodiments")
    copy_fixture(tmp, "lerobot", "dataset_video")
    shutil.copytree(copy_fixture(tmp, "lerobot_smolvla_tiny") / "tiny_smolvlm", tmp / "tiny_smolvlm")
    write_dataset(tmp / "arm6", [12, 10], rows_per_file=50, state_size=6, action_size=3, fps=15)
    members = [{"root": "dataset_video", "weight": 1}, {"root": "arm6", "weight": 1}]
    (tmp / "mixture.json").write_text(json.dumps(members))
    return tmp


def _mixture(workdir: Path, mixed: bool) -> MixedMixture:
    config = parse_config([f"--dataset.mixture={workdir / 'mixture.json'}"]).dataset
    assert isinstance(config, MixtureConfig)
    data = config.serving(mixed).load([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    assert isinstance(data, MixedMixture)
    return data


def test_each_item_is_its_members_own_sample_padded_with_masks(workdir: Path) -> None:
    data = _mixture(workdir, mixed=True)
    assert (data.obs_dim, data.action_dim) == (6, 3)
    assert data.input_features == [OBS_KEY, TOP, WRIST, TASK_KEY, FRONT]
    chunk = Frames.chunk(5)
    batch = data.gather(torch.tensor([3, VIDEO_FRAMES + 4]), chunk)
    video, arm = (m.gather(torch.tensor([i]), chunk) for m, i in zip(data.members, (3, 4), strict=True))
    assert torch.equal(batch[OBS_KEY][0, :4], video[OBS_KEY][0]) and torch.equal(
        batch[OBS_KEY][0, 4:], torch.zeros(2)
    )
    assert torch.equal(batch["action"][0, :, :2], video["action"][0]) and not batch["action"][0, :, 2].any()
    assert torch.equal(batch[OBS_KEY][1], arm[OBS_KEY][0]) and torch.equal(
        batch["action"][1], arm["action"][0]
    )
    assert batch[STATE_DIM_PAD_KEY].tolist() == [[False] * 4 + [True] * 2, [False] * 6]
    assert batch[ACTION_DIM_PAD_KEY].tolist() == [[False, False, True], [False] * 3]
    # a camera the item's member lacks is an empty, masked slot
    assert batch[f"{FRONT}_padding_mask"].tolist() == [False, True]
    assert batch[f"{TOP}_padding_mask"].tolist() == [True, False] and not batch[TOP][1].any()
    assert torch.equal(batch[FRONT][1], arm[FRONT][0]) and not batch[FRONT][0].any()


def test_each_member_keeps_its_own_fps(workdir: Path) -> None:
    """The 15 fps robot's chunk is its next 5 frames as written (a third of a second of it), beside the
    10 fps robot's (half a second): the offsets count each member's own frames."""
    data = _mixture(workdir, mixed=True)
    written = frames([12, 10])["action"]
    actions = np.concatenate([written, 0.5 * written[:, :1]], axis=1)  # write_dataset's action_size=3
    batch = data.gather(torch.tensor([VIDEO_FRAMES + 2]), Frames.chunk(5))
    assert torch.equal(batch["action"][0], torch.from_numpy(actions[2:7]))
    assert json.loads((workdir / "arm6" / "meta" / "info.json").read_text())["fps"] == 15


def test_padded_action_dims_get_exactly_zero_gradient(workdir: Path, monkeypatch) -> None:
    """The smaller robot's padded action dim gives its rows of the action output projection exactly zero
    gradient; the robot with that dim gives them a real one."""
    monkeypatch.chdir(workdir)
    data = _mixture(workdir, mixed=True)
    config = parse_config([*SMOLVLA, f"--dataset.mixture={workdir / 'mixture.json'}"]).policy
    from trainer.policies.base import fit_to_data

    torch.manual_seed(0)
    policy = build_policy(fit_to_data(config, data), data.obs_dim, data.action_dim)
    out = policy.model.action_out_proj

    def grads(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        policy.zero_grad()
        batch = data.gather(torch.tensor(indices), policy.config.frames)
        batch = {
            k: (v.float() / 255 if v.dtype == torch.uint8 and "images" in k else v) for k, v in batch.items()
        }
        loss, _ = policy(batch)
        loss.backward()
        return out.weight.grad.clone(), out.bias.grad.clone()

    weight, bias = grads([0, 10])  # the video robot: 2 action dims of 3
    assert not weight[2:].any() and not bias[2:].any()
    assert weight[:2].abs().sum() > 0
    weight, bias = grads([VIDEO_FRAMES, VIDEO_FRAMES + 5])  # the 3-dim robot
    assert weight[2].abs().sum() > 0 and not weight[3:].any()


@pytest.fixture(scope="module")
def straight(workdir: Path) -> Path:
    """4 steps of a tiny SmolVLA on the mixture, saved at steps 2 and 4."""
    flags = [*SMOLVLA, "--dataset.mixture=mixture.json", "--steps=4", "--save_freq=2"]
    train_in(workdir, [*flags, "--output_dir=straight"])
    return workdir / "straight"


def test_smolvla_trains_on_members_that_differ_and_resumes_bit_for_bit(workdir: Path, straight: Path) -> None:
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("event") == "train"]
    assert len(losses) == 4 and all(0 < loss < 100 for loss in losses)
    config = json.loads((straight / "checkpoints" / "last" / "pretrained_model" / "config.json").read_text())
    assert config["input_features"]["observation.state"]["shape"] == [6]
    assert config["output_features"]["action"]["shape"] == [3]
    resumed = rewound_copy(straight, workdir / "resumed", 2)
    train_in(workdir, ["--resume=true", "--steps=4", "--output_dir=resumed"])
    a, b = (
        load_file(str(run / "checkpoints" / "000004" / "pretrained_model" / "model.safetensors"))
        for run in (straight, resumed)
    )
    at_two = load_file(str(straight / "checkpoints" / "000002" / "pretrained_model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    assert not all(torch.equal(a[name], at_two[name]) for name in a)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("--policy.type=act", "the mixture's members disagree on fps (dataset_video 10, arm6 15): this policy trains on one; resample them to one rate; or train a policy that takes members that differ (--policy.type=smolvla)"),
        ("--policy.type=mlp", "the mixture's members disagree on fps (dataset_video 10, arm6 15)"),
    ],
)  # fmt: skip
def test_a_policy_that_cannot_take_members_that_differ_is_refused_in_one_line(
    workdir: Path, policy: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        train_in(
            workdir,
            [policy, "--dataset.mixture=mixture.json", "--steps=1", "--num_workers=0", "--output_dir=no"],
        )
    assert "\n" not in str(error.value)


def test_members_that_differ_in_a_feature_name_the_member_and_the_feature(workdir: Path) -> None:
    """Same fps: the first difference a fixed-layout policy meets is named with its members."""
    write_dataset(workdir / "arm6_10fps", [12, 10], rows_per_file=50, state_size=6, action_size=3)
    path = workdir / "same_rate.json"
    path.write_text(json.dumps([{"root": "dataset_video"}, {"root": "arm6_10fps"}]))
    config = parse_config([f"--dataset.mixture={path}"]).dataset
    message = "the mixture's members disagree on action size (dataset_video 2, arm6_10fps 3)"
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.load([OBS_KEY])
    write_dataset(workdir / "arm4", [12, 10], rows_per_file=50)
    path.write_text(json.dumps([{"root": "dataset_video"}, {"root": "arm4"}]))
    config = parse_config([f"--dataset.mixture={path}"]).dataset
    message = f"mixture member 1 (arm4): has no camera {TOP} (its cameras: {FRONT})"
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.load([OBS_KEY, TOP])


def test_held_out_frames_of_members_that_differ_are_counted_per_member(workdir: Path) -> None:
    path = workdir / "mixture.json"
    config = parse_config([f"--dataset.mixture={path}", "--dataset.eval_split=0.5"]).dataset
    held_out = config.serving(True).load_validation([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    assert isinstance(held_out, MixedMixture)
    assert held_out.weighted_order.labels == ["dataset_video", "arm6"]
    assert [len(member) for member in held_out.members] == list(held_out.weighted_order.sizes)
    assert held_out.gather(torch.tensor([len(held_out) - 1]), Frames.chunk(5))["action"].shape == (1, 5, 3)


def test_one_camera_name_of_two_frame_sizes_is_refused_in_one_line(workdir: Path) -> None:
    """Mapping the 4x4 camera onto the video robot's 24x40 slot would stack frames of two sizes."""
    path = workdir / "one_slot.json"
    members = [{"root": "dataset_video"}, {"root": "arm6", "rename_map": {FRONT: TOP}}]
    path.write_text(json.dumps(members))
    config = parse_config([f"--dataset.mixture={path}"]).dataset
    message = f"mixture member 1 (arm6): its camera {TOP} is 3x4x4, another member's 3x24x40"
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        config.serving(True).load([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    assert "\n" not in str(error.value)
