"""The cameras of a LeRobotDataset: per-sample frames, the map-style dataset `trainer.open_dataset`
returns (`LeRobotFrames`), and the training dataset that adds cameras to the batch.

Batch contract (the policies build against it): a camera used by the run is `observation.images.<name>`
in the batch, a uint8 (B, C, H, W) tensor exactly as decoded; the policy's preprocessor converts it to
float in [0, 1], augments and normalizes it on the device. Decoding happens where `gather` runs: in the
DataLoader workers (loader.py).

A camera's size is info.json's `shape`, read in the layout its `names` declare ((H, W, C) or LeRobot's
channel-first (C, H, W): `Info.camera_shape`); the frames are (C, H, W) whichever it is, as LeRobot's.
Every file is checked when the dataset is opened (`Cameras.check`: it exists, opens, holds a video
stream of info.json's size that covers its episodes' timestamps; an image column's first image of each
episode has a header of info.json's size), so a bad file stops the run before its
first step instead of inside a worker hours later. Each rank runs the same cheap checks and reaches the
same verdict, so no rank waits on another's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from trainer.config.dataset import PAD_SUFFIX, Frames, Stats
from trainer.data.dataset import IMAGENET_STATS, ArrayDataset, frames_as_float
from trainer.data.format import metadata as fmt
from trainer.data.format import validate
from trainer.data.format.decode import (
    DecodeError,
    VideoReader,
    check_image_header,
    decode_image,
    open_video,
    tolerance,
    video_duration,
)
from trainer.data.format.files import DatasetPath

FRAME_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


class Cameras:
    """The frames of `names` for the loaded frames (positions 0..n-1, in global frame order)."""

    def __init__(
        self,
        info: fmt.Info,
        names: Sequence[str],
        columns: dict[str, np.ndarray],
        video_backend: str = "pyav",
        tolerance_s: float | None = None,
    ) -> None:
        self.info = info
        self.names = list(names)
        self.episode = columns["episode_index"]
        self.timestamp = columns["timestamp"].reshape(-1)
        self.index = columns["index"]
        self.images = {n: columns[n] for n in self.names if info.features[n]["dtype"] == "image"}
        self.places = {n: fmt.read_video_places(info, n) for n in self.names if n not in self.images}
        self.reader = VideoReader(video_backend)
        self.tolerance = tolerance(info.fps, tolerance_s)

    def check(self) -> None:
        """The cheap checks of every video the loaded episodes use (see the module docstring)."""
        episodes, first, slot = np.unique(self.episode, return_index=True, return_inverse=True)
        for name, images in self.images.items():
            size, reading = self.info.camera_shape(name)[1:], self.info.camera_reading(name)
            for episode, position in zip(episodes.tolist(), first.tolist(), strict=True):
                where = f"{self.info.root} {name} (episode {episode}, index {int(self.index[position])})"
                check_image_header(images[position], where, size, reading)
        last = np.full(len(episodes), -np.inf)
        np.maximum.at(last, slot, self.timestamp)  # each episode's last timestamp
        for name, places in self.places.items():
            _, height, width = self.info.camera_shape(name)
            files: dict[DatasetPath, list[tuple[int, float]]] = {}  # file -> (episode, file time it needs)
            for episode, episode_last in zip(episodes.tolist(), last.tolist(), strict=True):
                if episode not in places:
                    raise DecodeError(
                        f"{self.info.root}: meta/episodes gives no video of {name} for episode {episode}; "
                        "the dataset is incomplete, re-download or re-write it"
                    )
                place = places[episode]
                files.setdefault(place.path, []).append((episode, place.from_timestamp + episode_last))
            for path, held in files.items():
                self._check_file(name, path, held, height, width)

    def _check_file(
        self, name: str, path: DatasetPath, held: list[tuple[int, float]], height: int, width: int
    ) -> None:
        if not path.is_file():
            raise DecodeError(
                f"{path}: the video of {name} for episode {held[0][0]} is missing; re-download it"
            )
        container = open_video(path)
        try:
            stream, covered = container.streams.video[0], video_duration(container)
            size = (stream.codec_context.height, stream.codec_context.width)
        finally:
            container.close()
        if size != (height, width):
            raise DecodeError(
                f"{path}: frames are {size[0]}x{size[1]}, meta/info.json says {name} is {height}x{width} "
                f"(episode {held[0][0]}), {self.info.camera_reading(name)}; re-encode the video or fix "
                "meta/info.json's shape or names"
            )
        episode, needed = max(held, key=lambda entry: entry[1])
        if needed >= covered + self.tolerance:
            raise DecodeError(
                f"{path}: the video lasts {covered:.3f} s but episode {episode} of {name} needs a frame at "
                f"{needed:.3f} s; the file is truncated: re-download or re-encode it"
            )

    def frame(self, name: str, position: int) -> torch.Tensor:
        """Camera `name` at loaded frame `position`: uint8 (C, H, W)."""
        episode = int(self.episode[position])
        where = f"episode {episode}, index {int(self.index[position])}"
        channels, height, width = self.info.camera_shape(name)
        if name in self.images:
            image = decode_image(
                self.images[name][position],
                f"{self.info.root} {name} ({where})",
                (height, width),
                self.info.camera_reading(name),
            )
            source = f"the image of {name}"
        else:
            place = self.places[name][episode]
            time = place.from_timestamp + float(self.timestamp[position])
            image = self.reader.frame(place.path, time, self.tolerance, where)
            source = str(place.path)
        if image.shape != (height, width, channels):
            raise DecodeError(
                f"{source}: a {image.shape[0]}x{image.shape[1]} frame of {image.shape[2]} channels ({where}), "
                f"meta/info.json says {height}x{width} of {channels}, {self.info.camera_reading(name)} "
                "(the decoders give RGB); "
                "re-encode the camera or fix meta/info.json's shape or names"
            )
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)  # (C, H, W), as LeRobot's

    def gather(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every camera at `positions`: uint8 (B, C, H, W) per camera key."""
        return {
            name: torch.stack([self.frame(name, int(p)) for p in positions.tolist()]) for name in self.names
        }


def camera_stats(
    info: fmt.Info, names: Sequence[str], saved: dict[str, dict[str, np.ndarray]], imagenet: bool
) -> Stats:
    """Per-channel mean/std, shape (C, 1, 1), of each camera: stats.json's, or ImageNet's
    (`--dataset.use_imagenet_stats`, LeRobot's default, for backbones pretrained on ImageNet)."""
    stats: Stats = {}
    for name in names:
        channels = info.camera_shape(name)[0]
        if imagenet and channels == 3:
            mean, std = IMAGENET_STATS["mean"].reshape(-1), IMAGENET_STATS["std"].reshape(-1)
        elif "mean" in saved.get(name, {}) and "std" in saved[name]:
            mean = torch.tensor(saved[name]["mean"], dtype=torch.float32).reshape(-1)
            std = torch.tensor(saved[name]["std"], dtype=torch.float32).reshape(-1)
        else:  # no statistics of this camera: keep [0, 1] as is
            mean, std = torch.zeros(channels), torch.ones(channels)
        stats[name] = {
            "mean": mean.reshape(channels, 1, 1),
            "std": std.clamp_min(validate.STD_FLOOR).reshape(channels, 1, 1),
        }
    return stats


class CameraDataset(ArrayDataset):
    """`ArrayDataset` whose batches also carry the run's cameras (uint8, decoded in `gather`)."""

    gather_in_workers = True

    def __init__(
        self,
        observations: np.ndarray,
        actions: np.ndarray,
        episode_lengths: np.ndarray,
        input_features: Sequence[str],
        stats: Stats,
        cameras: Cameras,
        camera_stats: Stats,
        tasks: Sequence[str] | None = None,
        vector_widths: Mapping[str, int] | None = None,
    ) -> None:
        arrays = (observations, actions, episode_lengths, input_features, stats)
        super().__init__(*arrays, tasks=tasks, vector_widths=vector_widths)
        self.cameras = cameras
        self._camera_stats = camera_stats

    def gather(self, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        """The arrays' batch and each camera's frames: (B, C, H, W), or (B, T, C, H, W) at the
        observation offsets with a history (decoded at the padded positions' own timestamps, flagged in
        `<camera>_is_pad`, as LeRobot decodes them)."""
        frames = Frames.of(frames)
        batch = super().gather(indices, frames)
        if not frames.history:
            return {**batch, **self.cameras.gather(indices)}
        seen, seen_pad = self.frame_positions(indices, frames.observation)
        for name, decoded in self.cameras.gather(seen.reshape(-1)).items():
            batch[name] = decoded.reshape(*seen.shape, *decoded.shape[1:])
            batch[name + PAD_SUFFIX] = seen_pad
        return batch

    def stats(self) -> Stats:
        return {**super().stats(), **self._camera_stats}


class LeRobotFrames(torch.utils.data.Dataset):
    """A LeRobotDataset as LeRobot's `__getitem__` gives it: item `i` of the chosen episodes (global
    frame order) is a dict of every camera (float32 (C, H, W) in [0, 1], or uint8), the float features,
    `timestamp`, `frame_index`, `episode_index`, `index` and `task`. A NaN or inf in a float feature
    is refused here (LeRobot would hand it on)."""

    def __init__(
        self,
        root: DatasetPath,
        episodes: Sequence[int] | None = None,
        return_uint8: bool = False,
        video_backend: str = "pyav",
        max_feature_size: int = validate.MAX_FEATURE_SIZE,
    ) -> None:
        info = fmt.read_info(root, max_feature_size)
        ranges = fmt.read_episode_ranges(root)
        chosen = sorted(ranges) if episodes is None else list(episodes)
        unknown = [e for e in chosen if e not in ranges]
        if unknown:
            raise DecodeError(
                f"{root}: no episode {unknown[0]}; the dataset holds episodes {min(ranges)}..{max(ranges)}"
            )
        self.floats = [n for n in info.features if info.is_float_vector(n) and n not in FRAME_COLUMNS]
        images = [n for n in info.cameras if info.features[n]["dtype"] == "image"]
        columns, _ = fmt.read_frames(info, chosen, ranges, [*FRAME_COLUMNS, *self.floats, *images])
        floats = {name: columns[name] for name in self.floats}
        validate.nonfinite_episodes(root, floats, chosen, ranges, skip=False)
        self.columns = columns
        self.tasks = fmt.read_tasks(root)
        self.cameras = Cameras(info, info.cameras, columns, video_backend)
        self.cameras.check()
        self.return_uint8 = return_uint8

    def __len__(self) -> int:
        return len(self.cameras.index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(f"frame {i} is outside [0, {len(self)})")
        item: dict[str, Any] = {}
        for name in self.cameras.names:
            frame = self.cameras.frame(name, i)
            item[name] = frame if self.return_uint8 else frames_as_float(frame)
        item.update({name: torch.from_numpy(self.columns[name][i].copy()) for name in self.floats})
        item["timestamp"] = torch.tensor(float(self.cameras.timestamp[i]), dtype=torch.float32)
        for name in ("frame_index", "episode_index", "index", "task_index"):
            item[name] = torch.tensor(int(self.columns[name][i]))
        item["task"] = self.tasks.get(int(self.columns["task_index"][i]), "")
        return item
