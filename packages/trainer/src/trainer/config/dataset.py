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
"""Mean and std (and the like) per batch key, for the normalization processors."""


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
    gather_in_workers: bool
    """`gather` decodes (cameras): the input pipeline runs it in DataLoader workers."""
    weighted_order: MixtureOrder | None
    """A mixture's draw order by weight, which the sampler follows; None draws uniformly."""

    def __len__(self) -> int: ...

    @property
    def obs_dim(self) -> int: ...

    @property
    def action_dim(self) -> int: ...

    def gather(self, indices: torch.Tensor, chunk_size: int) -> dict[str, torch.Tensor]: ...

    def stats(self) -> Stats: ...

    def episode_bounds(self) -> torch.Tensor: ...


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
