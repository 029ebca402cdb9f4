"""Observation history through the data layer: a policy's `observation_delta_indices` /
`action_delta_indices` (`config.dataset.Frames`) reach every gather, and the frames, their padding and
the `<key>_is_pad` masks are what LeRobot 0.6.1's dataset returns for the same delta timestamps
(`tests/fixtures/lerobot/history_frames.*`, written by LeRobot itself)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture, fixture_dir
from trainer.config.dataset import Frames
from trainer.data.dataset import ArrayDataset
from trainer.data.pipeline.mixture import Mixture
from trainer.data.pipeline.renamed import RenamedDataset
from trainer.data.sources.lerobot import LeRobotConfig

TOP, WRIST, STATE = "observation.images.top", "observation.images.wrist", "observation.state"
# LeRobot's delta timestamps of the fixture at 10 fps: state and cameras [-0.1, 0], action [-0.1 .. 0.6]
LEROBOT_FRAMES = Frames(observation=(-1, 0), action=tuple(range(-1, 7)))


def _indexed(lengths: list[int]) -> ArrayDataset:
    """Observations and actions that are their own frame index, so a gathered value names its frame."""
    frames = torch.arange(sum(lengths), dtype=torch.float32)[:, None]
    return ArrayDataset(frames, frames.clone(), lengths)


def test_offsets_stay_inside_the_episode_and_flag_what_they_padded() -> None:
    dataset = _indexed([3, 4])  # episodes [0, 3) and [3, 7)
    batch = dataset.gather(torch.tensor([0, 2, 3, 6]), Frames((-2, -1, 0), (-1, 0, 1)))
    assert batch[STATE][..., 0].tolist() == [[0, 0, 0], [0, 1, 2], [3, 3, 3], [4, 5, 6]]
    assert batch[STATE + "_is_pad"].tolist() == [
        [True, True, False],
        [False, False, False],
        [True, True, False],
        [False, False, False],
    ]
    assert batch["action"][..., 0].tolist() == [[0, 0, 1], [1, 2, 2], [3, 3, 4], [5, 6, 6]]
    assert batch["action_is_pad"].tolist() == [
        [True, False, False],
        [False, False, True],
        [True, False, False],
        [False, False, True],
    ]


def test_the_current_frame_alone_keeps_the_batch_as_it_was() -> None:
    """No frame axis and no observation masks without a history: what every policy before histories
    reads, and `gather(indices, chunk)` still means an action chunk of that size."""
    dataset = _indexed([5])
    assert Frames.of(3) == Frames((0,), (0, 1, 2)) and not Frames.of(3).history
    batch = dataset.gather(torch.tensor([1, 4]), 3)
    assert set(batch) == {STATE, "action", "action_is_pad"} and batch[STATE].shape == (2, 1)
    assert batch["action"][..., 0].tolist() == [[1, 2, 3], [4, 4, 4]]


@pytest.mark.parametrize("name", ["dataset_video", "dataset_images"])
def test_history_equals_lerobots_items_at_episode_starts_and_ends(name: str, tmp_path) -> None:
    reference = load_file(fixture_dir("lerobot", "history_frames.safetensors"))
    theirs = {key.split("/", 1)[1]: value for key, value in reference.items() if key.startswith(name + "/")}
    root = copy_fixture(tmp_path, "lerobot", name)
    dataset = LeRobotConfig(root=str(root), use_imagenet_stats=False).load([STATE, TOP, WRIST])
    ours = dataset.gather(theirs["index"], LEROBOT_FRAMES)
    for key in (STATE, "action"):  # values read from the parquet files: the same frames, bit for bit
        assert torch.equal(ours[key], theirs[key]), key
    for key in (STATE, TOP, WRIST, "action"):
        assert torch.equal(ours[key + "_is_pad"], theirs[key + "_is_pad"]), key
    for camera in (TOP, WRIST):  # (B, T, C, H, W) uint8; decoders may round differently, never by a frame
        assert ours[camera].shape == theirs[camera].shape == (10, 2, 3, 24, 40)
        difference = (ours[camera].float() - theirs[camera].float()).abs().mean()
        assert difference < 1.0, (camera, float(difference))
        shifted = (ours[camera][:, 1].float() - theirs[camera][:, 0].float()).abs().mean()
        assert shifted > 10 * difference, camera  # the history frame is the frame before, not this one


def test_renamed_and_mixed_sources_keep_each_frame_and_mask(tmp_path) -> None:
    """A renamed camera's mask follows its name; a mixture gathers each sample from its member with the
    same offsets."""
    root = copy_fixture(tmp_path, "lerobot", "dataset_images")
    dataset = LeRobotConfig(root=str(root), use_imagenet_stats=False).load([STATE, TOP])
    renamed = RenamedDataset(dataset, {TOP: "observation.images.front"})
    batch = renamed.gather(torch.tensor([20]), LEROBOT_FRAMES)
    assert {"observation.images.front", "observation.images.front_is_pad"} <= set(batch)
    assert TOP not in batch and batch["observation.images.front_is_pad"].tolist() == [[True, False]]
    mixture = Mixture([_indexed([2, 2]), _indexed([3])], [1.0, 1.0], ["a", "b"])
    mixed = mixture.gather(torch.tensor([4, 1, 2]), Frames((-1, 0), (0, 1)))
    assert mixed[STATE][..., 0].tolist() == [[0, 0], [0, 1], [2, 2]]  # b's frame 0; a's 1; a's 2
    assert mixed[STATE + "_is_pad"].tolist() == [[True, False], [False, False], [True, False]]
