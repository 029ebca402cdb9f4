"""The base of every dataset config: `--dataset.type` picks the subclass.

Plain values only: the built-in datasets (`trainer/data/`) register their config subclasses where they
are defined; `load()` returns an object of the `Dataset` protocol defined here, what the engine reads
from any data (`trainer/data/dataset.py: ArrayDataset` implements it over arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import draccus

if TYPE_CHECKING:
    import torch

Stats = dict[str, dict[str, "torch.Tensor"]]
# How a policy brings camera frames, (N, C, H, W) floats in [0, 1], to its input size
# (`PolicyConfig.frame_resize`; a mixture whose members record one camera at different sizes uses it).
FrameResize = Callable[["torch.Tensor"], "torch.Tensor"]
"""Mean and std (and the like) per batch key, for the normalization processors."""

PAD_SUFFIX = "_is_pad"  # `<key>_is_pad`: which of a key's frames lie outside the sample's episode


@dataclass(frozen=True)
class Frames:
    """The frames a policy reads around each sample, counted in frames from it, as LeRobot's
    `observation_delta_indices` / `action_delta_indices`: `observation` for the observation features
    (the state and the cameras; 0 is the sample's own frame, -1 the one before) and `action` for the
    action chunk. A frame outside the sample's episode is the episode's nearest one, flagged True in
    `<key>_is_pad` (what LeRobot's dataset returns). With the current observation only (`(0,)`) a batch
    holds observations without a frame axis and no observation pad keys, as before histories existed."""

    observation: tuple[int, ...] = (0,)
    action: tuple[int, ...] = (0,)

    @classmethod
    def chunk(cls, size: int) -> Frames:
        """The current observation and the next `size` actions (ACT's chunk)."""
        return cls((0,), tuple(range(size)))

    @classmethod
    def of(cls, frames: Frames | int) -> Frames:
        """`frames` as given, or an action chunk's size (what `gather` took before histories)."""
        return frames if isinstance(frames, Frames) else cls.chunk(frames)

    @property
    def history(self) -> bool:
        """Whether the observation has a frame axis (more than the current frame)."""
        return self.observation != (0,)


class MixtureOrder(Protocol):
    """How a mixture's frames are drawn (data/pipeline/sampler.py: WeightedOrder): member k's
    `sizes[k]` frames lie at global indices `[starts[k], starts[k] + sizes[k])`."""

    labels: list[str]
    starts: torch.Tensor
    sizes: torch.Tensor
    length: int

    def order(self, seed: int, epoch: int) -> torch.Tensor: ...

    def counts(self, indices: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Dataset(Protocol):
    """What the training loop, validation and evaluation read from a dataset."""

    input_features: list[str]
    vector_widths: dict[str, int]
    """The width of each float vector among `input_features`, in the order they are concatenated
    into `observation.state` ({} when the dataset does not know them apart): how a policy that reads
    one of them on its own (ACT's `observation.environment_state`) finds it."""

    @property
    def gather_in_workers(self) -> bool:
        """`gather` decodes (cameras): the input pipeline runs it in DataLoader workers."""
        ...

    @property
    def weighted_order(self) -> MixtureOrder | None:
        """A mixture's draw order by weight, which the sampler follows; None draws uniformly."""
        ...

    def __len__(self) -> int: ...

    @property
    def obs_dim(self) -> int: ...

    @property
    def action_dim(self) -> int: ...

    def gather(self, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        """The batch of the samples at `indices` with the frames `frames` names (an int: an action
        chunk of that size, the current observation only)."""
        ...

    def stats(self) -> Stats: ...

    def episode_bounds(self) -> torch.Tensor: ...

    def distinct_tasks(self) -> list[str]:
        """The distinct task texts of its frames, in first-seen order ([] when `task` is not among
        `input_features`): what a policy computes once per task before step 1 (`Policy.prepare_tasks`)."""
        ...


@dataclass(frozen=True)
class Embodiment:
    """One robot of a mixture whose members differ (data/pipeline/embodiments.py): the member it is
    (`name`, the member's label), its own state and action sizes, and the observation features it
    has under the mixture's names (state, its cameras, the task). Each item of such a mixture carries
    its embodiment's index (`embodiment` in the batch) and is normalized by that embodiment's
    statistics; the saved processors keep one set per embodiment, and `load_policy(embodiment=)` /
    `trainer export --embodiment` give the policy for one robot."""

    name: str
    obs_dim: int
    action_dim: int
    input_features: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "input_features": list(self.input_features),
        }


@runtime_checkable
class EmbodiedDataset(Protocol):
    """A dataset of several robots (a mixture whose members differ): `embodiments` in index order and
    each one's statistics, widened to the dataset's layout (`embodiment_stats`, in the same order)."""

    embodiments: list[Embodiment]

    def embodiment_stats(self) -> list[Stats]: ...


def embodiments_of(dataset: object) -> list[Embodiment]:
    """The robots a dataset's items come from ([] for one robot's data: its `stats()` normalize it)."""
    return list(dataset.embodiments) if isinstance(dataset, EmbodiedDataset) else []


@dataclass
class DatasetConfig(draccus.ChoiceRegistry):
    """Base of every dataset config; `--dataset.type` picks the subclass."""

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    def load(self, input_features: Sequence[str] = ()) -> Dataset:
        """The training data. `input_features` are the observation features the policy asks for
        (empty: the dataset's default); a feature the dataset cannot provide is a ConfigError."""
        raise NotImplementedError

    def load_validation(self, input_features: Sequence[str] = ()) -> Dataset | None:
        """Held-out data for `val_loss`, or None when the config holds none out."""
        return None

    def serving(
        self, mixed_members: bool, padded: bool = True, resize: FrameResize | None = None
    ) -> DatasetConfig:
        """This config as it serves a policy that does (`mixed_members`) or does not take a mixture whose
        members differ (`PolicyConfig.takes_mixed_members`); `padded`: whether their state and action
        sizes and cameras may differ too (`PolicyConfig.pads_mixed_members`); `resize`: how the policy
        resizes its frames, so members may record a camera at different sizes
        (`PolicyConfig.frame_resize`). Only a mixture answers otherwise than itself, so a dataset plugin
        implements `load` alone."""
        return self

    def banner(self) -> list[str]:
        """Lines the run's start banner shows about the data (sources, unused features)."""
        return []

    def augmentation(
        self, seed: int, rank: int
    ) -> Callable[[dict[str, torch.Tensor], int], dict[str, torch.Tensor]] | None:
        """`augment(batch, step)` for the training batches on the device, or None (no augmentation)."""
        return None

    @property
    def rollout_episodes(self) -> int:
        """Episodes of the simulated task rolled out at the end of training (0: the data has no sim)."""
        return 0

    @property
    def rollout_camera(self) -> bool:
        """Whether those rollouts run the sim's camera task (data/embedded/sim.py)."""
        return False
