"""Robots whose cameras share a name at different frame sizes (data/pipeline/resized.py): served to the
policies that resize every frame to their own input size (SmolVLA, pi0/pi0.5), each member's frames
resized as the policy's own preprocessing does; a policy that reads frames at their recorded size
refuses them in one line naming the member and the camera. On LeRobot-written datasets:
`dataset_arm6` (`front` 3x16x16, 15 fps, state 6, action 3), `dataset_channel_first` (`front` 3x8x8,
`side` 3x16x32, 10 fps) and `dataset_images` (`top`/`wrist` 3x24x40, renamed to `front`/`side`)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from helpers.engine_run import TINY_SMOLVLA, train_in
from helpers.fixtures import copy_fixture
from trainer.cli.parse import parse_config
from trainer.config.dataset import Dataset
from trainer.data.dataset import ALL_CAMERAS, OBS_KEY, TASK_KEY, frames_as_float
from trainer.data.sources.lerobot import LeRobotConfig
from trainer.errors import ConfigError
from trainer.policies import build_policy
from trainer.policies.common.base import fit_to_data
from trainer.policies.common.vla.images import resize_with_pad

FRONT, SIDE = "observation.images.front", "observation.images.side"
ARM6_FRAMES = 22  # dataset_arm6's frames come first in `robots.json`'s index space

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("frame_sizes")
    for name in ("dataset_arm6", "dataset_channel_first", "dataset_images"):
        copy_fixture(tmp, "lerobot", name)
    shutil.copytree(copy_fixture(tmp, "lerobot_smolvla_tiny") / "tiny_smolvlm", tmp / "tiny_smolvlm")
    robots = [{"root": "dataset_arm6"}, {"root": "dataset_channel_first"}]
    (tmp / "robots.json").write_text(json.dumps(robots))
    rename = {"observation.images.top": FRONT, "observation.images.wrist": SIDE}
    same = [{"root": "dataset_channel_first"}, {"root": "dataset_images", "rename_map": rename}]
    (tmp / "same_layout.json").write_text(json.dumps(same))
    return tmp


def _served(workdir: Path, file: str, policy: list[str]) -> tuple[Dataset, object]:
    config = parse_config([f"--dataset.mixture={workdir / file}", *policy])
    served = config.dataset.serving(
        config.policy.takes_mixed_members, config.policy.pads_mixed_members, config.policy.frame_resize()
    )
    return served.load([OBS_KEY, ALL_CAMERAS, TASK_KEY]), config.policy


def _own(workdir: Path, root: str, index: int, frames: object) -> dict[str, torch.Tensor]:
    """One member's own sample, as a single-dataset run reads it."""
    data = LeRobotConfig(root=str(workdir / root)).load([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    return data.gather(torch.tensor([index]), frames)


def test_smolvla_reads_each_robots_frames_resized_as_it_resizes_them(workdir: Path, monkeypatch) -> None:
    """Robots that differ (SmolVLA's padded mixture): `front` is 3x16x16 on one and 3x8x8 on the other;
    each item's frames are that robot's own, through SmolVLA's resize with padding, and the images
    SmolVLA builds from the mixture's batch are the ones it builds from the robot's own frames."""
    monkeypatch.chdir(workdir)
    data, config = _served(workdir, "robots.json", TINY_SMOLVLA)
    batch = data.gather(torch.tensor([3, ARM6_FRAMES + 4]), config.frames)
    assert batch[FRONT].shape == (2, 3, 32, 32) and batch[FRONT].dtype == torch.float32
    policy = build_policy(fit_to_data(config, data), data.obs_dim, data.action_dim)
    for row, (root, index) in enumerate((("dataset_arm6", 3), ("dataset_channel_first", 4))):
        own = frames_as_float(_own(workdir, root, index, config.frames)[FRONT])
        assert own.shape[-2:] == ((16, 16), (8, 8))[row]
        assert torch.equal(batch[FRONT][row : row + 1], resize_with_pad(own, 32, 32))
        served, mine = policy._images({FRONT: batch[FRONT][row : row + 1]}), policy._images({FRONT: own})
        assert torch.equal(served[0][0], mine[0][0])


def test_smolvla_trains_on_robots_whose_cameras_differ_in_size(workdir: Path) -> None:
    train_in(workdir, [*TINY_SMOLVLA, "--dataset.mixture=robots.json", "--steps=1", "--output_dir=smolvla"])
    log = (workdir / "smolvla" / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in log if '"loss"' in line]
    assert losses and all(math.isfinite(loss) for loss in losses)


def test_pi0_reads_one_layouts_members_resized_as_it_resizes_them(workdir: Path) -> None:
    """Members of one layout (pi0 takes no robots that differ) whose `front` and `side` differ in size:
    each through pi0's centred resize to its image resolution."""
    data, _ = _served(workdir, "same_layout.json", ["--policy.type=pi0", "--policy.image_resolution=[28,28]"])
    batch = data.gather(torch.tensor([5]), 1)
    assert batch[FRONT].shape == (1, 3, 28, 28) and batch[SIDE].shape == (1, 3, 28, 28)
    own = _own(workdir, "dataset_channel_first", 5, 1)
    for name in (FRONT, SIDE):
        assert torch.equal(batch[name], resize_with_pad(own[name].float() / 255, 28, 28, centred=True))


@pytest.mark.parametrize("policy", ["--policy.type=act", "--policy.type=diffusion"])
def test_a_policy_of_fixed_frame_sizes_refuses_them_naming_member_and_camera(
    workdir: Path, policy: str
) -> None:
    message = (
        "mixture member 1 (dataset_images): its camera observation.images.front is 3x24x40, another "
        "member's 3x8x8: this policy reads frames at their recorded size"
    )
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        _served(workdir, "same_layout.json", [policy, "--policy.pretrained_backbone_weights=null"])
    assert "\n" not in str(error.value)
