"""`--dataset.type=lerobot`: a LeRobotDataset v3.0, with LeRobot's own flags.

`--dataset.repo_id=ID --dataset.root=PATH` reads the dataset at PATH (a LeRobot user's flags work
unchanged; the type is implied by them). Without `--dataset.root` the id resolves through the Hugging
Face cache (downloaded once per node by its first rank, see `hub.download_once`).

The policy's observation is every float vector `observation.*` feature (or `--policy.input_features`),
concatenated in the order meta/info.json lists them; `action` is the target. The statistics for the
normalization processors are meta/stats.json's mean, std, min, max, q01 and q99 of the same features.

Cameras (`observation.images.*`, image or video features) are decoded only for a policy that asks for
them by naming them in `--policy.input_features` (`observation.images.*`: every camera; a camera
policy's config puts that in its default `input_features`). They reach the batch as uint8
`observation.images.<name>` (cameras.py), with per-channel statistics from stats.json or ImageNet's
(`--dataset.use_imagenet_stats`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import ckpt_tools
from trainer.config.dataset import Dataset, DatasetConfig, Stats
from trainer.data.dataset import (
    ACTION_KEY,
    ALL_CAMERAS,
    OBS_KEY,
    TASK_KEY,
    ArrayDataset,
    check_input_features,
    is_camera,
)
from trainer.data.format import metadata as fmt
from trainer.data.format import validate
from trainer.data.format.cameras import CameraDataset, Cameras, LeRobotFrames, camera_stats
from trainer.data.format.decode import VIDEO_BACKENDS
from trainer.data.format.files import DatasetPath, dataset_root
from trainer.data.pipeline.augment import Augment, ImageTransformsConfig
from trainer.errors import ConfigError


@DatasetConfig.register_subclass("lerobot")
@dataclass
class LeRobotConfig(DatasetConfig):
    """A LeRobotDataset v3.0 (local directory or Hub dataset repo)."""

    repo_id: str | None = None
    """Hugging Face dataset repo id; without --dataset.root it is read through the Hub cache."""
    root: str | None = None
    """Local directory of the dataset (the one holding meta/ and data/); with --dataset.streaming, an
    fsspec URL (s3://bucket/path, hf://datasets/owner/name[@revision], file:///path)."""
    streaming: bool = False
    """Read --dataset.root where it lies, fetching only the byte ranges each sample needs, instead of
    reading a local copy (docs/datasets_at_scale.md#streaming)."""
    cache_size: str = "1GiB"
    """Most bytes of streamed files each process (the main one, every DataLoader worker) keeps in memory."""
    revision: str | None = None
    """Branch, tag or commit of --dataset.repo_id to download (default: the repo's default branch)."""
    episodes: list[int] | None = None
    """Train on these episode indices only; default: every episode not in --dataset.val_episodes."""
    val_episodes: list[int] = field(default_factory=list)
    """Held-out episode indices: never trained on, their val_loss is logged every --eval_freq steps."""
    video_backend: str = "pyav"
    """Video decoder: pyav (LeRobot's reference path) or torchcodec (needs the `torchcodec` extra)."""
    tolerance_s: float | None = None
    """Seconds the decoded video frame nearest a sample's timestamp may lie from it before the sample is
    refused (LeRobot's --tolerance_s, which sets it; LeRobot's default is 1e-4); unset: just under one
    frame period."""
    use_imagenet_stats: bool = True
    """Normalize 3-channel cameras with ImageNet's mean/std instead of stats.json's (LeRobot's default,
    for vision backbones pretrained on ImageNet)."""
    image_transforms: ImageTransformsConfig = field(default_factory=ImageTransformsConfig)
    """Training-time camera augmentation (data/pipeline/augment.py)."""
    eval_split: float = 0.0
    """Hold out this fraction of each task's episodes (its last ones by index, at least one, never all)
    instead of naming them with --dataset.val_episodes."""
    max_feature_size: int = validate.MAX_FEATURE_SIZE
    """Most values one frame of one feature may declare in meta/info.json (a camera's height x width x
    channels): a larger one is refused at open, before anything is allocated for it."""
    skip_nonfinite: bool = False
    """Train without the episodes whose state or action frames hold NaN or inf (the run's banner says
    how many); by default the first such frame stops the run at open, naming its episode and frame."""

    def __post_init__(self) -> None:
        if self.video_backend not in VIDEO_BACKENDS:
            raise ConfigError(
                f"--dataset.video_backend={self.video_backend} is not one of {', '.join(VIDEO_BACKENDS)}"
            )
        if self.root and ckpt_tools.layout.is_url(self.root) and not self.streaming:
            raise ConfigError(
                f"--dataset.root={self.root} is a URL, read in place only when streamed: add "
                "--dataset.streaming=true (docs/datasets_at_scale.md#streaming)"
            )
        if self.tolerance_s is not None and self.tolerance_s <= 0:
            raise ConfigError(f"--tolerance_s must be > 0 seconds, got {self.tolerance_s}")
        if not self.root and not self.repo_id:
            raise ConfigError("--dataset.type=lerobot needs --dataset.root=PATH or --dataset.repo_id=ID")
        if self.streaming and not self.root:
            raise ConfigError(
                "--dataset.streaming=true reads --dataset.root in place: pass --dataset.root=s3://bucket/path "
                "or hf://datasets/owner/name"
            )
        self.cache_bytes()
        if self.max_feature_size < 1:
            raise ConfigError(f"--dataset.max_feature_size must be >= 1, got {self.max_feature_size}")
        if not 0.0 <= self.eval_split < 1.0:
            raise ConfigError(f"--dataset.eval_split must be in [0, 1), got {self.eval_split}")
        if self.eval_split and self.val_episodes:
            raise ConfigError(
                "--dataset.eval_split and --dataset.val_episodes both choose the held-out episodes: set one"
            )
        overlap = sorted(set(self.episodes or ()) & set(self.val_episodes))
        if overlap:
            raise ConfigError(
                f"episodes {overlap} are in both --dataset.episodes and --dataset.val_episodes: "
                "a held-out episode must not be trained on"
            )

    def cache_bytes(self) -> int:
        """--dataset.cache_size in bytes."""
        try:
            return ckpt_tools.parse_size(self.cache_size, option="--dataset.cache_size")
        except ckpt_tools.UsageError as exc:
            raise ConfigError(str(exc)) from None

    def local_root(self) -> DatasetPath:
        """The dataset directory: --dataset.root (read in place when streaming), else the repo's
        snapshot in the Hub cache."""
        if self.root:
            return dataset_root(self.root, self.streaming, self.cache_bytes())
        from trainer.data.sources.hub import download_once

        assert self.repo_id is not None
        return Path(download_once(self.repo_id, self.revision))

    def train_episodes(self, root: DatasetPath, ranges: dict[int, tuple[int, int]]) -> list[int]:
        held_out = set(self.held_out_episodes(root, ranges))
        chosen = self.episodes if self.episodes is not None else sorted(set(ranges) - held_out)
        if self.eval_split:
            chosen = [e for e in chosen if e not in held_out]
        return _check_episodes(chosen, ranges, "--dataset.episodes")

    def held_out_episodes(self, root: DatasetPath, ranges: dict[int, tuple[int, int]]) -> list[int]:
        """--dataset.val_episodes, or the --dataset.eval_split of each task's episodes (of
        --dataset.episodes when given)."""
        if not self.eval_split:
            return list(self.val_episodes)
        tasks = fmt.read_episode_tasks(root)
        by_task: dict[tuple[str, ...], list[int]] = {}
        for episode in sorted(self.episodes if self.episodes is not None else ranges):
            by_task.setdefault(tasks.get(episode, ()), []).append(episode)
        held: list[int] = []
        for episodes in by_task.values():
            count = min(max(1, round(len(episodes) * self.eval_split)), len(episodes) - 1)
            held.extend(episodes[len(episodes) - count :])
        return sorted(held)

    def load(self, input_features: Sequence[str] = ()) -> Dataset:
        root = self.local_root()
        ranges = fmt.read_episode_ranges(root)
        return _load(root, self.train_episodes(root, ranges), ranges, input_features, self)

    def load_validation(self, input_features: Sequence[str] = ()) -> Dataset | None:
        if not self.val_episodes and not self.eval_split:
            return None
        root = self.local_root()
        ranges = fmt.read_episode_ranges(root)
        held_out = self.held_out_episodes(root, ranges)
        flag = "--dataset.eval_split" if self.eval_split else "--dataset.val_episodes"
        return _load(root, _check_episodes(held_out, ranges, flag), ranges, input_features, self)

    def augmentation(self, seed: int, rank: int) -> Augment | None:
        return Augment(self.image_transforms, seed, rank) if self.image_transforms.enable else None

    def banner(self) -> list[str]:
        info = fmt.read_info(self.local_root(), self.max_feature_size)
        cameras = ", ".join(f"{n} ({info.features[n]['dtype']})" for n in info.cameras) or "none"
        return [
            f"LeRobotDataset {self.repo_id or info.root}{f'@{self.revision}' if self.revision else ''} "
            f"({fmt.CODEBASE_VERSION}, {info.fps:g} fps); cameras: {cameras}"
        ]


def _check_episodes(chosen: Sequence[int], ranges: dict[int, tuple[int, int]], flag: str) -> list[int]:
    if not chosen:
        raise ConfigError(f"{flag} selects no episode: give at least one")
    bad = [e for e in chosen if e not in ranges]
    if bad:
        raise ConfigError(
            f"{flag} names episode {bad[0]}, but the dataset holds episodes {min(ranges)}..{max(ranges)}"
        )
    return list(chosen)


def _load(
    root: DatasetPath,
    episodes: list[int],
    ranges: dict[int, tuple[int, int]],
    requested: Sequence[str],
    config: LeRobotConfig,
) -> ArrayDataset:
    info = fmt.read_info(root, config.max_feature_size)
    cameras = _requested_cameras(info, requested)
    features = check_input_features(
        [n for n in requested if n not in cameras and n not in (ALL_CAMERAS, TASK_KEY)],
        info.observation_features,
        f"the dataset at {root}",
    )
    extra = ["timestamp", "episode_index", "index"] if cameras else []  # where each camera frame is
    extra += [n for n in cameras if info.features[n]["dtype"] == "image"]
    language = [TASK_KEY] if TASK_KEY in requested else []
    extra += ["task_index"] if language else []
    columns = [*features, ACTION_KEY, *extra]
    frames, lengths = fmt.read_frames(info, episodes, ranges, columns)
    saved, notes = fmt.read_stats(info)
    notes += _unread_note(info, [*features, *cameras])
    skipped = validate.nonfinite_episodes(
        root,
        {n: frames[n] for n in [*features, ACTION_KEY]},
        episodes,
        ranges,
        config.skip_nonfinite,
    )
    if skipped:
        kept = [e for e in episodes if e not in set(skipped)]
        notes.append(
            f"--dataset.skip_nonfinite: skipped {len(skipped)} of {len(episodes)} episodes holding NaN or inf "
            f"({', '.join(map(str, skipped[:10]))}{', ...' if len(skipped) > 10 else ''})"
        )
        frames, lengths = fmt.read_frames(
            info, _check_episodes(kept, ranges, "--dataset.skip_nonfinite"), ranges, columns
        )
    observations = (
        frames[features[0]] if len(features) == 1 else np.concatenate([frames[n] for n in features], 1)
    )
    stats = _stats(saved, features, frames)
    arrays = (observations, frames[ACTION_KEY], lengths, [*features, *cameras, *language], stats)
    tasks = _task_texts(root, frames["task_index"]) if language else None
    widths = {name: int(frames[name].shape[1]) for name in features}
    if not cameras:
        dataset = ArrayDataset(*arrays, tasks=tasks, vector_widths=widths)
    else:
        reader = Cameras(info, cameras, frames, config.video_backend, config.tolerance_s)
        reader.check()
        camera = camera_stats(info, cameras, saved, config.use_imagenet_stats)
        dataset = CameraDataset(*arrays, reader, camera, tasks=tasks, vector_widths=widths)
    dataset.notes = notes
    return dataset


def _unread_note(info: fmt.Info, read: Sequence[str]) -> list[str]:
    """The banner's line naming the dataset's cameras and observation vectors the policy does not
    read, so none is left out without a word."""
    unread = [n for n in (*info.cameras, *info.observation_features) if n not in read]
    if not unread:
        return []
    return [
        f"the policy does not read {', '.join(unread)} of the dataset; name them in "
        "--policy.input_features to use them"
    ]


def _task_texts(root: DatasetPath, task_index: np.ndarray) -> list[str]:
    """Each frame's task text (meta/tasks.parquet); a frame whose task is not listed is refused."""
    table = fmt.read_tasks(root)
    missing = sorted({int(i) for i in np.unique(task_index)} - table.keys())
    if missing:
        raise ConfigError(
            f"{root}: frames name task_index {missing[0]}, which meta/tasks.parquet does not list; "
            "the policy reads the task text: repair the dataset's meta/tasks.parquet"
        )
    return [table[int(i)] for i in task_index.reshape(-1).tolist()]


def _requested_cameras(info: fmt.Info, requested: Sequence[str]) -> list[str]:
    """The cameras among the requested features (`observation.images.*` names every camera, whatever
    its name: how a camera policy's config asks for them by default); a depth map, audio, or a camera
    the batch cannot carry under its name (`is_camera`) is refused rather than dropped."""
    cameras = []
    for name in requested:
        if name == ALL_CAMERAS:
            cameras += [_servable(info, n) for n in info.cameras if n not in cameras]
            continue
        feature = info.features.get(name, {})
        if feature.get("dtype") == "audio" or feature.get("info", {}).get("is_depth_map"):
            kind = "audio" if feature.get("dtype") == "audio" else "depth map"
            raise ConfigError(
                f"--policy.input_features names {name!r}, a {kind}: the trainer reads RGB cameras only; drop it"
            )
        if feature.get("dtype") in fmt.VISUAL_DTYPES:
            cameras.append(_servable(info, name))
    return cameras


def _servable(info: fmt.Info, camera: str) -> str:
    """`camera`, when a batch can carry it under its name (`is_camera`: LeRobot's camera names)."""
    if not is_camera(camera):
        raise ConfigError(
            f"{info.root}: camera {camera!r} ({info.features[camera]['dtype']} feature) has a name the "
            "trainer cannot serve a camera under; rename the feature in meta/info.json to "
            "observation.images.<name> (or observation.image, a robot's only camera)"
        )
    return camera


def open_dataset(
    repo_id: str | None = None,
    root: str | Path | None = None,
    episodes: Sequence[int] | None = None,
    return_uint8: bool = False,
    video_backend: str = "pyav",
    max_feature_size: int = validate.MAX_FEATURE_SIZE,
    streaming: bool = False,
    cache_size: str = "1GiB",
) -> LeRobotFrames:
    """The LeRobotDataset at `root` (else `repo_id` through the Hugging Face cache) as a map-style torch
    dataset of LeRobot's item dicts; every metadata field and camera file is checked before it returns,
    and a NaN or inf float frame is refused (validate.py). `streaming` reads a URL `root` in place
    through a `cache_size` block cache (`data/format/remote.py`)."""
    config = LeRobotConfig(
        repo_id=repo_id,
        root=None if root is None else str(root),
        video_backend=video_backend,
        max_feature_size=max_feature_size,
        streaming=streaming,
        cache_size=cache_size,
    )
    return LeRobotFrames(config.local_root(), episodes, return_uint8, video_backend, max_feature_size)


def _stats(
    saved: dict[str, dict[str, np.ndarray]], features: list[str], frames: dict[str, np.ndarray]
) -> Stats:
    """meta/stats.json's mean/std/min/max and 1st/99th percentiles per feature, concatenated like the
    observation (computed from the loaded frames for a feature the file lacks)."""
    computed: dict[str, Callable[..., np.ndarray]] = {
        "mean": np.mean,
        "std": np.std,
        "min": np.min,
        "max": np.max,
        "q01": functools.partial(np.quantile, q=0.01),
        "q99": functools.partial(np.quantile, q=0.99),
    }

    def of(name: str, key: str) -> np.ndarray:
        entry = saved.get(name, {})
        if key in entry:
            return np.asarray(entry[key], dtype=np.float32).reshape(-1)
        moment: np.ndarray = computed[key](frames[name].astype(np.float64), axis=0)  # numpy types it Any
        return moment.astype(np.float32)

    def stat(names: list[str]) -> dict[str, torch.Tensor]:
        out = {key: torch.from_numpy(np.concatenate([of(n, key) for n in names])) for key in computed}
        out["std"] = out["std"].clamp_min(validate.STD_FLOOR)
        return out

    return {OBS_KEY: stat(features), ACTION_KEY: stat([ACTION_KEY])}
