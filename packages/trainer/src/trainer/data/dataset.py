"""The dataset plug-in protocol (`trainer.config.dataset.Dataset`) over in-memory arrays, the batch keys,
and the feature checks datasets share.

A dataset is chosen with `--dataset.type` (a built-in name, or `package.module:ConfigClass` for an
outside one). Its config is a `DatasetConfig` subclass whose `load()` returns an object with:

- `len(dataset)`: frames (samples) in the order the sampler indexes them;
- `obs_dim`, `action_dim`, `input_features`: feature sizes, and the names of the observation
  features concatenated (in this order) into the policy's observation vector;
- `vector_widths`: the width of each of those float vectors, in that order ({} when not known apart);
- `gather(indices, frames)`: a batch `{observation.state, action, action_is_pad}` with the frames
  `config.dataset.Frames` names around each sample (the action chunk, the observation history), none
  taken across its episode's bounds (`<key>_is_pad` flags the padded ones), plus each camera among
  `input_features` as `observation.images.<name>` (or `observation.image`, `is_camera`): uint8 frames (B, C, H, W), or (B, T, C, H, W) with
  a history, normalized by the policy's preprocessor;
- with `task` among `input_features`, each frame's task text as UTF-8 bytes (`task_bytes`), for a
  policy that reads the language instruction;
- `stats()`: mean/std per batch key, for the normalization processors (a camera's per channel,
  shaped (C, 1, 1), on the [0, 1] scale), and min/max and q01/q99 where the data has them (a policy
  that normalizes by range or quantiles, `normalization_stats`, refuses data without them);
- `episode_bounds()`: one `[start, end)` frame range per episode;
- `distinct_tasks()`: the distinct task texts (with `task` among `input_features`; else []);
- `gather_in_workers`: True when `gather` decodes (cameras), so the input pipeline runs it in
  DataLoader workers (data/pipeline/loader.py); in-memory data is gathered in the training process;
- `weighted_order`: a mixture's draw order by weight (data/pipeline/sampler.py), None for one dataset.

`ArrayDataset` implements all of it over in-memory arrays, so a new dataset only has to produce
observations, actions and episode lengths.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from trainer.config.dataset import PAD_SUFFIX, Frames, Stats
from trainer.errors import ConfigError

OBS_KEY = "observation.state"
ACTION_KEY = "action"
ENV_KEY = "observation.environment_state"  # LeRobot's environment state, a separate vector there
PAD_KEY = "action_is_pad"
# A mixture of members that differ (data/pipeline/embodiments.py): which of an item's state and action
# values are padding, (B, width) True past the member's own size, and a camera slot's presence
# (`<camera>_padding_mask`, (B,) False where the item's member has no such camera: an empty slot).
STATE_DIM_PAD_KEY = "observation.state_dim_is_pad"
ACTION_DIM_PAD_KEY = "action_dim_is_pad"
CAMERA_MASK_SUFFIX = "_padding_mask"
# ... and the item's robot: the index of its member's `config.dataset.Embodiment` (B,) int64, which
# picks the statistics the preprocessor normalizes it with.
EMBODIMENT_KEY = "embodiment"
CAMERA_PREFIX = "observation.images."
ALL_CAMERAS = CAMERA_PREFIX + "*"  # in --policy.input_features: every camera of the dataset
# LeRobot's name for a robot's only camera (its OBS_IMAGE: PushT's datasets, environment and policies).
SINGLE_CAMERA = "observation.image"
# In --policy.input_features: the frame's task text, gathered as UTF-8 bytes (B, longest) zero-padded
# (a batch holds tensors only; a language policy decodes them with `task_texts`).
TASK_KEY = "task"
# What a camera is normalized with, as LeRobot does by default (its datasets' `use_imagenet_stats`):
# the statistics the pretrained ResNet trunks were trained with, on the [0, 1] scale.
IMAGENET_STATS = {
    "mean": torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1),
    "std": torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1),
}


def is_camera(feature: str) -> bool:
    """Whether a batch or policy feature holds a camera's frames. The data tells a camera by its
    dtype (`image` or `video`, LeRobot's rule: `metadata.Info.cameras`); past the data only names
    travel (a batch, a saved config.json), so a camera is served under one of LeRobot's two camera
    names: `observation.images.<name>`, or `observation.image` for a robot's only camera (PushT)."""
    return feature.startswith(CAMERA_PREFIX) or feature == SINGLE_CAMERA


class ArrayDataset:
    """The protocol over flat in-memory arrays: frames of consecutive episodes, one after another.

    `images` holds each camera's frames as uint8 (frames, C, H, W); the cameras among `input_features`
    are gathered into batches (kept uint8 until the preprocessor, so a batch moves at a quarter of the
    bytes)."""

    gather_in_workers = False
    weighted_order = None

    def __init__(
        self,
        observations: np.ndarray | torch.Tensor,
        actions: np.ndarray | torch.Tensor,
        episode_lengths: Sequence[int] | np.ndarray,
        input_features: Sequence[str] = (OBS_KEY,),
        stats: Stats | None = None,
        images: dict[str, np.ndarray | torch.Tensor] | None = None,
        tasks: Sequence[str] | None = None,
        vector_widths: Mapping[str, int] | None = None,
    ) -> None:
        with warnings.catch_warnings():  # arrays read from Arrow are read-only views; nothing writes them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.observations = torch.as_tensor(observations, dtype=torch.float32)
            self.actions = torch.as_tensor(actions, dtype=torch.float32)
        lengths = torch.as_tensor(np.asarray(episode_lengths, dtype=np.int64))
        if self.observations.ndim != 2 or self.actions.ndim != 2:
            raise ConfigError("a dataset's observations and actions must be 2-D arrays (frames x features)")
        if len(self.observations) != len(self.actions) or int(lengths.sum()) != len(self.actions):
            raise ConfigError(
                f"dataset sizes disagree: {len(self.observations)} observations, {len(self.actions)} actions, "
                f"episodes of {int(lengths.sum())} frames in all"
            )
        if len(lengths) and int(lengths.min()) < 1:
            raise ConfigError("every episode of a dataset must hold at least one frame")
        ends = torch.cumsum(lengths, 0)
        self._bounds = torch.stack([ends - lengths, ends], dim=1)
        self.episode_first = torch.repeat_interleave(ends - lengths, lengths)
        self.episode_last = torch.repeat_interleave(ends - 1, lengths)
        self.input_features = list(input_features)
        self.vector_widths = self._vector_widths(vector_widths)
        self._stats = stats
        self.notes: list[str] = []  # lines the run's banner prints about this data (frames skipped...)
        self.images = {
            name: torch.as_tensor(frames) for name, frames in (images or {}).items() if name in input_features
        }
        if tasks is not None and len(tasks) != len(self.actions):
            raise ConfigError(f"a dataset's tasks cover {len(tasks)} frames, its actions {len(self.actions)}")
        self.tasks = list(tasks) if tasks is not None and TASK_KEY in input_features else None
        for name, frames in self.images.items():
            if frames.dtype != torch.uint8 or frames.ndim != 4 or len(frames) != len(self.actions):
                raise ConfigError(
                    f"camera {name!r}: expected uint8 frames (frames, C, H, W) for {len(self.actions)} frames, "
                    f"got {frames.dtype} {tuple(frames.shape)}"
                )

    def _vector_widths(self, given: Mapping[str, int] | None) -> dict[str, int]:
        """`given` (checked to add up to the observation's width), else the one float vector's width
        when there is one ({} when several are concatenated and their widths were not given)."""
        if given is None:
            vectors = [n for n in self.input_features if not is_camera(n) and n != TASK_KEY]
            return {vectors[0]: self.obs_dim} if len(vectors) == 1 else {}
        if sum(given.values()) != self.obs_dim:
            raise ConfigError(
                f"a dataset's vector widths {dict(given)} add up to {sum(given.values())}, not its "
                f"{self.obs_dim} observation values: give one width per float vector, in order"
            )
        return dict(given)

    def __len__(self) -> int:
        return len(self.observations)

    @property
    def obs_dim(self) -> int:
        return self.observations.shape[1]

    @property
    def action_dim(self) -> int:
        return self.actions.shape[1]

    def frame_positions(
        self, indices: torch.Tensor, offsets: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The frames at `offsets` from each index, kept inside its episode: (positions, is_pad), both
        (B, len(offsets)); a padded frame is the episode's first or last, as LeRobot's dataset pads."""
        wanted = indices[:, None] + torch.tensor(offsets, dtype=torch.int64)[None, :]
        first, last = self.episode_first[indices][:, None], self.episode_last[indices][:, None]
        return torch.minimum(torch.maximum(wanted, first), last), (wanted < first) | (wanted > last)

    def gather(self, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        """The observations at each index (the frames `frames.observation` names, with a history) and
        its action chunk at `frames.action`; frames past its episode's bounds repeat the nearest one
        and are flagged in `<key>_is_pad`."""
        frames = Frames.of(frames)
        steps, action_pad = self.frame_positions(indices, frames.action)
        observed = {OBS_KEY: self.observations, **self.images}
        if frames.history:
            seen, seen_pad = self.frame_positions(indices, frames.observation)
            batch = {name: values[seen] for name, values in observed.items()}
            batch.update({name + PAD_SUFFIX: seen_pad for name in observed})
        else:
            batch = {name: values[indices] for name, values in observed.items()}
        batch.update({ACTION_KEY: self.actions[steps], PAD_KEY: action_pad})
        if self.tasks is not None:
            batch[TASK_KEY] = task_bytes([self.tasks[i] for i in indices.tolist()])
        return batch

    def stats(self) -> Stats:
        """The statistics given at construction, else mean, std, min, max, q01 and q99 over these frames
        (min and max for a MIN_MAX policy: Diffusion Policy's state and action; the 1st and 99th
        percentiles for QUANTILES: pi0.5's); ImageNet's for the cameras."""
        cameras = {name: dict(IMAGENET_STATS) for name in self.images}
        if self._stats is not None:
            return {**cameras, **self._stats}
        return {
            **cameras,
            **{
                key: {
                    "mean": data.mean(0),
                    "std": data.std(0).clamp_min(1e-6),
                    "min": data.amin(0),
                    "max": data.amax(0),
                    "q01": torch.quantile(data.double(), 0.01, dim=0).to(data.dtype),
                    "q99": torch.quantile(data.double(), 0.99, dim=0).to(data.dtype),
                }
                for key, data in ((OBS_KEY, self.observations), (ACTION_KEY, self.actions))
            },
        }

    def episode_bounds(self) -> torch.Tensor:
        return self._bounds

    def distinct_tasks(self) -> list[str]:
        return list(dict.fromkeys(self.tasks)) if self.tasks is not None else []


def task_bytes(texts: Sequence[str]) -> torch.Tensor:
    """Task texts as a uint8 tensor (B, longest in bytes), zero-padded (`task_texts` inverts it)."""
    encoded = [text.encode("utf-8") for text in texts]
    out = torch.zeros(len(encoded), max((len(e) for e in encoded), default=0), dtype=torch.uint8)
    for row, data in enumerate(encoded):
        out[row, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else out[row, :0]
    return out


def cat_task_bytes(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """`task_bytes` tensors of several batches as one (each zero-padded to the widest first)."""
    width = max(part.shape[1] for part in parts)
    return torch.cat([torch.nn.functional.pad(part, (0, width - part.shape[1])) for part in parts])


def task_texts(tensor: torch.Tensor) -> list[str]:
    """The texts `task_bytes` encoded (any dtype holding the byte values, on any device)."""
    rows = tensor.detach().to("cpu", torch.uint8).numpy()
    return [bytes(row).rstrip(b"\0").decode("utf-8") for row in rows]


def check_input_features(requested: Sequence[str], available: Sequence[str], what: str) -> list[str]:
    """The observation features a run uses: `requested` (each one known to `what`), else all."""
    unknown = [name for name in requested if name not in available]
    if unknown:
        raise ConfigError(
            f"--policy.input_features names {unknown[0]!r}, which {what} does not provide "
            f"(available: {', '.join(available) or 'none'}); choose among those"
        )
    return list(requested) or list(available)


def camera_frames(batch: Mapping[str, torch.Tensor]) -> list[str]:
    """The keys of a batch that hold camera frames, sorted: not the masks named after a camera
    (`<camera>_is_pad` of a history, `<camera>_padding_mask` of a mixture's empty slot)."""
    return sorted(k for k in batch if is_camera(k) and not k.endswith((PAD_SUFFIX, CAMERA_MASK_SUFFIX)))


def frames_as_float(frames: torch.Tensor) -> torch.Tensor:
    """Camera frames as a policy reads them: uint8 as decoded -> float32 in [0, 1], divided by 255 as
    LeRobot divides; frames already float (converted, or augmented) pass unchanged."""
    return frames.float() / 255 if frames.dtype == torch.uint8 else frames
