"""Observation history through the data layer: a policy's `observation_delta_indices` /
`action_delta_indices` (`config.dataset.Frames`) reach every gather, and the frames, their padding and
the `<key>_is_pad` masks are what LeRobot 0.6.1's dataset returns for the same delta timestamps
(`tests/fixtures/lerobot/history_frames.*`, written by LeRobot itself): read locally (video and image
cameras), streamed from S3 (moto), from a mixture of both datasets, and in DataLoader workers, where a
sampler resumed mid-run delivers the uninterrupted run's batches bit for bit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest
import torch
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture, fixture_dir
from trainer.config.dataset import Frames
from trainer.data.dataset import ArrayDataset
from trainer.data.pipeline import loader
from trainer.data.pipeline.mixture import Mixture
from trainer.data.pipeline.renamed import RenamedDataset
from trainer.data.pipeline.sampler import GlobalOrderSampler
from trainer.data.sources.lerobot import LeRobotConfig
from trainer.data.sources.mixture import MixtureConfig

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


def lerobots_items(name: str) -> dict[str, torch.Tensor]:
    """What LeRobot's dataset `name` returned at the fixture's indices, by key (row r: indices[r])."""
    reference = load_file(fixture_dir("lerobot", "history_frames.safetensors"))
    return {key.split("/", 1)[1]: value for key, value in reference.items() if key.startswith(name + "/")}


def assert_lerobots_items(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """The state and action bit for bit (read from the parquet files), every `_is_pad` mask equal, the
    cameras (B, T, C, H, W) uint8 within decoder rounding and never a frame off."""
    for key in (STATE, "action"):
        assert torch.equal(ours[key], theirs[key]), key
    for key in (STATE, TOP, WRIST, "action"):
        assert torch.equal(ours[key + "_is_pad"], theirs[key + "_is_pad"]), key
    for camera in (TOP, WRIST):  # decoders may round differently, never by a frame
        assert ours[camera].shape == theirs[camera].shape == (len(theirs["index"]), 2, 3, 24, 40)
        difference = (ours[camera].float() - theirs[camera].float()).abs().mean()
        assert difference < 1.0, (camera, float(difference))
        shifted = (ours[camera][:, 1].float() - theirs[camera][:, 0].float()).abs().mean()
        assert shifted > 10 * difference, camera  # the history frame is the frame before, not this one


@pytest.mark.parametrize("name", ["dataset_video", "dataset_images"])
def test_history_equals_lerobots_items_at_episode_starts_and_ends(name: str, tmp_path) -> None:
    theirs = lerobots_items(name)
    root = copy_fixture(tmp_path, "lerobot", name)
    dataset = LeRobotConfig(root=str(root), use_imagenet_stats=False).load([STATE, TOP, WRIST])
    assert_lerobots_items(dataset.gather(theirs["index"], LEROBOT_FRAMES), theirs)


@pytest.fixture(scope="module")
def streamed(s3_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Both camera datasets uploaded to a bucket of the moto server: name -> s3:// URL."""
    store = fsspec.filesystem("s3", use_listings_cache=False)
    bucket = f"history-{uuid.uuid4().hex[:12]}"
    store.mkdir(bucket)
    local = tmp_path_factory.mktemp("history")
    urls = {}
    for name in ("dataset_video", "dataset_images"):
        urls[name] = f"s3://{bucket}/{name}"
        store.put(f"{copy_fixture(local, 'lerobot', name)}/", urls[name], recursive=True)
    yield urls
    store.rm(bucket, recursive=True)


def test_streamed_history_equals_lerobots_items_and_the_local_bytes(streamed, tmp_path) -> None:
    """`--dataset.streaming=true`: video and image cameras read in place from S3, with their history."""
    for name, url in streamed.items():
        theirs = lerobots_items(name)
        config = LeRobotConfig(root=url, streaming=True, cache_size="256KiB", use_imagenet_stats=False)
        ours = config.load([STATE, TOP, WRIST]).gather(theirs["index"], LEROBOT_FRAMES)
        assert_lerobots_items(ours, theirs)
        root = copy_fixture(tmp_path, "lerobot", name)
        local = LeRobotConfig(root=str(root), use_imagenet_stats=False).load([STATE, TOP, WRIST])
        expected = local.gather(theirs["index"], LEROBOT_FRAMES)
        assert all(torch.equal(ours[key], expected[key]) for key in expected), name


def test_a_streamed_mixture_in_workers_gives_lerobots_items_and_resumes_bit_for_bit(streamed) -> None:
    """A mixture of the two streamed datasets, gathered in 2 DataLoader workers: every sample (the
    fixture's indices in each member, 20 in all, 5 per step) is LeRobot's item of its member; a sampler
    restored at step 2's position delivers steps 3 and 4 as the uninterrupted one did, bit for bit."""
    roots = f"[{streamed['dataset_video']},{streamed['dataset_images']}]"
    mixture = MixtureConfig(root=roots, streaming=True, use_imagenet_stats=False).load([STATE, TOP, WRIST])
    video, images = lerobots_items("dataset_video"), lerobots_items("dataset_images")
    kept = torch.cat([video["index"], images["index"] + len(mixture.members[0])])
    reference = {key: torch.cat([video[key], images[key]]) for key in video}

    def sampler() -> GlobalOrderSampler:
        return GlobalOrderSampler(len(mixture), 5, 1, 0, seed=4, weighted=mixture.weighted_order, kept=kept)

    settings = loader.LoaderSettings(num_workers=2, timeout_s=120)
    straight, drawn = sampler(), sampler()
    order = [drawn.next_indices() for _ in range(4)]
    batches = list(loader.batches(mixture, straight, range(4), LEROBOT_FRAMES, settings))
    rows = torch.cat([torch.nonzero(kept == i).reshape(-1) for o in order for i in o.tolist()])
    assert sorted(rows.tolist()) == list(range(20))  # every sample once: both members, all 10 indices
    gathered = {key: torch.cat([b[key] for b in batches]) for key in batches[0]}
    assert_lerobots_items(gathered, {key: value[rows] for key, value in reference.items()})
    resumed = sampler()
    resumed.set_position(*drawn_after(sampler(), 2))
    again = list(loader.batches(mixture, resumed, range(2, 4), LEROBOT_FRAMES, settings))
    for want, got in zip(batches[2:], again, strict=True):
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert resumed.position == straight.position


def drawn_after(sampler: GlobalOrderSampler, steps: int) -> tuple[int, int]:
    """The position a run's sampler records after `steps` steps (what a checkpoint holds)."""
    for _ in range(steps):
        sampler.next_indices()
    return sampler.position


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
