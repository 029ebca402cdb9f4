"""Cameras in: frames equal to what LeRobot decoded, the batch contract, the worker pipeline's sample
order and resume, and one-line errors for every bad camera input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import trainer
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.lerobot_data import IMAGE, write_dataset
from trainer.cli.parse import parse_config
from trainer.data.dataset import IMAGENET_STATS
from trainer.data.format.decode import DecodeError, VideoReader, tolerance
from trainer.data.pipeline import loader
from trainer.data.pipeline.augment import Augment, ImageTransformsConfig
from trainer.data.pipeline.processors import build_processors
from trainer.data.pipeline.sampler import GlobalOrderSampler
from trainer.data.sources.lerobot import LeRobotConfig
from trainer.engine.plan import train
from trainer.errors import ConfigError

TOP, WRIST = "observation.images.top", "observation.images.wrist"
CAMERA_POLICY = "helpers.camera_policy:CameraPolicyConfig"


@pytest.fixture(scope="module")
def video_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory.mktemp("video"), "lerobot", "dataset_video")


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["dataset_video", "dataset_images", "dataset_channel_first"])
def test_frames_equal_what_lerobot_decoded_and_none_is_a_neighbour(name, tmp_path) -> None:
    """dataset_channel_first declares its cameras (C, H, W) in info.json, the others (H, W, C): the
    items are (C, H, W) either way, as LeRobot's."""
    reference = load_file(fixture_dir("lerobot", f"{name}_frames.safetensors"))
    dataset = trainer.open_dataset(root=copy_fixture(tmp_path, "lerobot", name))
    cameras = sorted(key for key in reference if key.startswith("observation.images."))
    assert cameras == sorted(dataset.cameras.names) and len(cameras) == 2
    for position, index in enumerate(reference["index"].tolist()):
        item = dataset[index]
        assert int(item["index"]) == index and float(item["timestamp"]) == float(
            reference["timestamp"][position]
        )
        for camera in cameras:
            expected = reference[camera][position]
            assert item[camera].dtype == torch.float32 and item[camera].shape == expected.shape
            if f"source.{camera}" in reference and dataset.cameras.info.features[camera]["dtype"] == "image":
                assert torch.equal(item[camera], reference[f"source.{camera}"][position] / 255)  # lossless
            own = (item[camera] - expected).abs().mean()
            assert own < 0.01, (camera, index)
            for neighbour in (index - 1, index + 1):  # an off-by-one frame would be closer to them
                if 0 <= neighbour < len(dataset):
                    assert (dataset[neighbour][camera] - expected).abs().mean() > own, (
                        camera,
                        index,
                        neighbour,
                    )


@pytest.mark.parametrize("flat", [False, True])
def test_channel_first_cameras_batch_as_lerobots_policy_features_with_per_channel_stats(flat, tmp_path):
    """dataset_channel_first: the batch's frames have the shapes LeRobot's `dataset_to_policy_features`
    gives its policies, and stats.json's (3, 1, 1) nested lists (or the same values flat) are the
    normalization's per-channel mean and std."""
    root = copy_fixture(tmp_path, "lerobot", "dataset_channel_first")
    saved = json.loads((root / "meta/stats.json").read_text())
    if flat:
        for camera, key in [
            (c, k) for c in ("observation.images.front", "observation.images.side") for k in ("mean", "std")
        ]:
            saved[camera][key] = torch.tensor(saved[camera][key]).flatten().tolist()
        (root / "meta/stats.json").write_text(json.dumps(saved))
    with safe_open(fixture_dir("lerobot", "dataset_channel_first_frames.safetensors"), "pt") as frames:
        features = json.loads(frames.metadata()["dataset_to_policy_features"])
    dataset = LeRobotConfig(root=str(root), use_imagenet_stats=False).load(["observation.images.*"])
    batch, stats = dataset.gather(torch.tensor([0, 19]), 1), dataset.stats()
    visual = {name: tuple(f["shape"]) for name, f in features.items() if f["type"] == "VISUAL"}
    assert (
        {name: tuple(batch[name].shape[1:]) for name in visual}
        == visual
        == {
            "observation.images.front": (3, 8, 8),
            "observation.images.side": (3, 16, 32),
        }
    )
    for camera in visual:
        for key in ("mean", "std"):
            expected = torch.tensor(saved[camera][key], dtype=torch.float32).reshape(3, 1, 1)
            assert torch.equal(stats[camera][key], expected), (camera, key)


def test_items_carry_lerobots_keys_and_uint8_on_request(video_root) -> None:
    dataset = trainer.open_dataset(root=video_root, episodes=[3], return_uint8=True)
    item = dataset[5]
    assert len(dataset) == 20 and item[TOP].dtype == torch.uint8 and item[TOP].shape == (3, 24, 40)
    assert (int(item["episode_index"]), int(item["frame_index"]), int(item["index"])) == (3, 5, 65)
    assert item["task"] == "reach the corner the colour names"
    assert item["observation.state"].shape == (4,) and item["action"].dtype == torch.float32


def test_the_batch_carries_uint8_cameras_normalized_by_the_preprocessor(video_root) -> None:
    dataset = LeRobotConfig(root=str(video_root), use_imagenet_stats=False).load(["observation.images.*"])
    batch = dataset.gather(torch.tensor([0, 21, 79]), 2)
    assert {k: (v.dtype, tuple(v.shape)) for k, v in batch.items() if "images" in k} == {
        TOP: (torch.uint8, (3, 3, 24, 40)),
        WRIST: (torch.uint8, (3, 3, 24, 40)),
    }
    stats = dataset.stats()
    saved = json.loads((video_root / "meta/stats.json").read_text())
    assert torch.allclose(stats[TOP]["mean"], torch.tensor(saved[TOP]["mean"]))  # (3, 1, 1)
    normalized = build_processors(stats)[0](batch)[TOP]
    expected = (batch[TOP].float() / 255 - stats[TOP]["mean"]) / stats[TOP]["std"]
    assert normalized.dtype == torch.float32 and torch.allclose(normalized, expected)
    imagenet = LeRobotConfig(root=str(video_root)).load([TOP]).stats()[TOP]["mean"]
    assert imagenet.flatten().tolist() == pytest.approx(IMAGENET_STATS["mean"].flatten().tolist())


def test_a_policy_that_asks_for_no_camera_gets_none(video_root) -> None:
    dataset = LeRobotConfig(root=str(video_root)).load()
    assert set(dataset.gather(torch.tensor([0, 1]), 1)) == {"observation.state", "action", "action_is_pad"}
    assert not getattr(dataset, "gather_in_workers", False)


class _Indices:
    """A dataset whose batch is its indices, gathered in workers like a camera dataset."""

    gather_in_workers = True

    def __init__(self, die_on: int = -1) -> None:
        self.die_on = die_on

    def gather(self, indices: torch.Tensor, chunk_size: int) -> dict[str, torch.Tensor]:
        if self.die_on in indices.tolist():
            if self.die_on == 0:
                raise DecodeError("videos/x.mp4: cannot decode the frame at 0.1 s for episode 0")
            os.kill(os.getpid(), signal.SIGKILL)
        return {"indices": indices}


def _drawn(sampler: GlobalOrderSampler, steps: int, workers: int, dataset=None) -> list[list[int]]:
    settings = loader.LoaderSettings(num_workers=workers, timeout_s=30)
    feed = loader.batches(dataset or _Indices(), sampler, range(steps), 1, settings)
    return [batch["indices"].tolist() for batch in feed]


@pytest.mark.parametrize("rank", [0, 1])
def test_workers_keep_the_global_order_and_a_resume_continues_it(rank) -> None:
    def sampler() -> GlobalOrderSampler:
        return GlobalOrderSampler(50, batch_size=4, dp_world_size=2, dp_rank=rank, seed=7)

    straight = _drawn(sampler(), 9, workers=0)
    first = sampler()
    head = _drawn(first, 4, workers=2)
    assert first.position == (0, 32)  # moved by the batches handed out, not by the prefetched ones
    resumed = sampler()
    resumed.set_position(*first.position)
    assert head + _drawn(resumed, 5, workers=2) == straight


def test_a_failing_or_killed_worker_is_one_line() -> None:
    sampler = GlobalOrderSampler(50, batch_size=50, dp_world_size=1, dp_rank=0, seed=0)
    with pytest.raises(DecodeError, match=r"^videos/x.mp4: cannot decode the frame at 0.1 s for episode 0$"):
        _drawn(sampler, 2, workers=1, dataset=_Indices(die_on=0))
    feed = loader.batches(_Indices(die_on=3), sampler, range(2), 1, loader.LoaderSettings(1, timeout_s=3))
    with pytest.raises(
        DecodeError, match=r"a data loader worker stopped delivering batches within 3 s"
    ) as info:
        next(feed)
    assert "\n" not in str(info.value) and "--num_workers=1" in str(info.value)


def test_augmentation_is_drawn_from_the_step_and_rank_alone(video_root) -> None:
    dataset = LeRobotConfig(root=str(video_root)).load([TOP])
    batch = dataset.gather(torch.arange(16), 1)
    augment = Augment(ImageTransformsConfig(enable=True), seed=3, rank=0)
    torch.manual_seed(0)
    first = augment(batch, step=5)[TOP]
    global_draw = torch.rand(1)
    torch.manual_seed(1)  # another global RNG state (another worker count, another resume point)
    again = augment(batch, step=5)[TOP]
    torch.manual_seed(0)
    assert torch.equal(torch.rand(1), global_draw)  # the global RNG is not consumed
    assert (
        first.dtype == torch.float32
        and first.shape == (16, 3, 24, 40)
        and 0 <= first.min() <= first.max() <= 1
    )
    assert torch.equal(first, again)
    assert not torch.equal(first, augment(batch, step=6)[TOP])
    assert not torch.equal(first, Augment(ImageTransformsConfig(enable=True), seed=3, rank=1)(batch, 5)[TOP])
    assert not torch.equal(first, batch[TOP].float() / 255)


def test_augmentation_without_kornia_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "kornia", None)
    with pytest.raises(
        ConfigError, match=r"^--dataset.image_transforms.enable=true needs kornia: pip install"
    ):
        Augment(ImageTransformsConfig(enable=True), seed=0, rank=0)


def test_camera_run_resumes_sample_exact_with_workers(video_root, tmp_path, clean_accelerate) -> None:
    from accelerate.state import AcceleratorState

    flags = [f"--dataset.root={video_root}", f"--policy.type={CAMERA_POLICY}", "--policy.dropout=0"]
    flags += [
        "--use_policy_training_preset=false",
        "--scheduler.type=constant",
        "--batch_size=8",
        "--save_freq=3",
        "--log_freq=3",
    ]
    flags += ["--dataset.image_transforms.enable=true"]  # drawn per step: the resumed run draws the same
    runs = []
    for name, extra, steps in [
        ("a", ["--num_workers=2"], 6),
        ("b", ["--num_workers=0"], 6),
        ("c", ["--num_workers=1"], 3),
    ]:
        runs.append(
            train(parse_config([*flags, *extra, f"--steps={steps}", f"--output_dir={tmp_path / name}"]))
        )
        AcceleratorState._reset_state(reset_partial_state=True)
    resumed = train(parse_config(["--resume=true", "--steps=6", f"--output_dir={tmp_path / 'c'}"]))
    weights = [
        load_file(Path(s.last_checkpoint) / "pretrained_model" / "model.safetensors")
        for s in (runs[0], runs[1], resumed)
    ]
    assert [torch.equal(w["head.weight"], weights[0]["head.weight"]) for w in weights[1:]] == [True, True]
    saved = json.loads((Path(resumed.last_checkpoint) / "pretrained_model" / "config.json").read_text())
    assert saved["input_features"] == ["observation.state", TOP, WRIST]


def _video(root: Path, episode: int = 3) -> Path:
    return root / f"videos/{WRIST}/chunk-000/file-{episode:03d}.mp4"


def _shift_episode(root: Path) -> None:
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    column = f"videos/{WRIST}/from_timestamp"
    shifted = pa.array([0.0, 0.0, 0.0, 1.0])  # episode 3's frames would run to 2.9 s of a 2 s video
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, shifted), path)


def _resize(root: Path) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][WRIST]["shape"] = [32, 40, 3]
    (root / "meta/info.json").write_text(json.dumps(info))


def _depth(root: Path) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][WRIST]["info"]["is_depth_map"] = True
    (root / "meta/info.json").write_text(json.dumps(info))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (
            lambda r: _video(r).unlink(),
            r"file-003.mp4: the video of .*wrist for episode 3 is missing; re-download",
        ),
        (
            lambda r: _video(r).write_bytes(_video(r).read_bytes()[:600]),
            r"file-003.mp4: (the video lasts .* needs a frame|not a readable video|holds no video)",
        ),
        (
            lambda r: _video(r).write_bytes(b"not a video" * 50),
            r"file-003.mp4: not a readable video .* re-download",
        ),
        (
            _shift_episode,
            r"file-003.mp4: the video lasts 2.000 s but episode 3 of .*wrist needs a frame at 2.900 s",
        ),
        (_resize, r"file-000.mp4: frames are 24x40, meta/info.json says .*wrist is 32x40 \(episode 0\)"),
        (_depth, r"names 'observation.images.wrist', a depth map: the trainer reads RGB cameras only"),
    ],
)
def test_bad_camera_files_are_one_line_errors_at_load(video_root, tmp_path, damage, match) -> None:
    root = tmp_path / "ds"
    shutil.copytree(video_root, root)
    damage(root)
    with pytest.raises(ConfigError, match=match) as info:
        LeRobotConfig(root=str(root)).load([TOP, WRIST])
    assert "\n" not in str(info.value)


def test_an_undecodable_image_names_the_episode_and_the_fix(tmp_path) -> None:
    """Found at open: the first image of each episode is checked there (its header)."""
    write_dataset(tmp_path / "ds", [5, 5], rows_per_file=4, broken_images=True)
    with pytest.raises(DecodeError, match=r"images.front \(episode 0, index 0\): the image bytes do not"):
        LeRobotConfig(root=str(tmp_path / "ds")).load([IMAGE])


def test_torchcodec_is_refused_in_one_line_when_it_does_not_import(video_root, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchcodec", None)  # as if not installed
    with pytest.raises(
        ConfigError, match=r"^--dataset.video_backend=torchcodec needs torchcodec: pip install"
    ):
        LeRobotConfig(root=str(video_root), video_backend="torchcodec").load([TOP])


class _Counting:
    """A container that counts the frames decoded through it."""

    def __init__(self, container, decoded: list[float]) -> None:
        self.container, self.decoded, self.streams = container, decoded, container.streams

    def seek(self, *args, **kwargs) -> None:
        self.container.seek(*args, **kwargs)

    def decode(self, stream):
        for frame in self.container.decode(stream):
            self.decoded.append(frame.time)
            yield frame


def test_a_frame_is_decoded_from_its_keyframe_never_from_the_file_start(video_root, monkeypatch) -> None:
    decoded: list[float] = []
    original = VideoReader._container
    monkeypatch.setattr(
        VideoReader, "_container", lambda self, path: _Counting(original(self, path), decoded)
    )
    path = video_root / f"videos/{TOP}/chunk-000/file-000.mp4"  # 60 frames, a keyframe every 2
    image = VideoReader().frame(path, 5.9, tolerance(10), "episode 2, index 59")
    reference = load_file(fixture_dir("lerobot", "dataset_video_frames.safetensors"))[TOP][3]  # index 59
    assert (torch.from_numpy(image).permute(2, 0, 1).float() / 255 - reference).abs().mean() < 0.01
    assert decoded == pytest.approx([5.8, 5.9])


def test_a_timestamp_past_the_video_names_file_time_and_nearest_frame(video_root) -> None:
    path = video_root / f"videos/{TOP}/chunk-000/file-000.mp4"
    with pytest.raises(
        DecodeError, match=r"file-000.mp4: no frame within 0.0999 s of 7.5000 s for episode 2"
    ) as info:
        VideoReader().frame(path, 7.5, tolerance(10), "episode 2, index 59")
    assert "the nearest frame is at 5.9000 s" in str(info.value) and "\n" not in str(info.value)
