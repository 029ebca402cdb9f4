"""The embedded demonstration dataset: scripted-expert episodes of the sim task, cached on disk.

Generation is deterministic in (episodes, seed), so every rank may build or read the cache on its own:
the file is written under a temporary name and renamed, and identical bytes win any race.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer.data import sim
from trainer.errors import ConfigError

OBS_KEY = "observation.state"
ACTION_KEY = "action"
PAD_KEY = "action_is_pad"
DATASET_TYPES = ("pendulum",)


@dataclass
class DatasetConfig:
    """The demonstrations to train on."""

    type: str = "pendulum"
    """Dataset kind; `pendulum` is the embedded Pendulum-v1 swing-up expert, generated offline."""
    episodes: int = 50
    """Expert episodes of 200 steps each."""
    seed: int = 0
    """Seeds the episodes' start states (independent of the run's --seed)."""
    cache_dir: str | None = None
    """Where the generated episodes are cached; default $TRAINER_CACHE or ~/.cache/trainer."""
    noise: float = 0.5
    """Std of the torque noise executed (not recorded) while demonstrating, so the data covers recoveries."""
    eval_episodes: int = 8
    """Episodes rolled out at the end to compare the policy with a random one (split across ranks)."""

    def __post_init__(self) -> None:
        if self.type not in DATASET_TYPES:
            raise ConfigError(f"--dataset.type={self.type!r} is not one of {', '.join(DATASET_TYPES)}")
        if self.episodes < 1:
            raise ConfigError(f"--dataset.episodes must be >= 1, got {self.episodes}")
        if self.noise < 0:
            raise ConfigError(f"--dataset.noise must be >= 0, got {self.noise}")
        if self.eval_episodes < 0:
            raise ConfigError(f"--dataset.eval_episodes must be >= 0, got {self.eval_episodes}")

    def cache_path(self) -> Path:
        root = self.cache_dir or os.environ.get("TRAINER_CACHE") or Path.home() / ".cache" / "trainer"
        return Path(root) / f"{self.type}_v1_ep{self.episodes}_seed{self.seed}_noise{self.noise:g}.npz"


class DemonstrationDataset:
    """Flat arrays of (observation, action) with each sample's episode end, for action chunks."""

    def __init__(self, observations: np.ndarray, actions: np.ndarray, episode_last: np.ndarray) -> None:
        self.observations = torch.from_numpy(observations)
        self.actions = torch.from_numpy(actions)
        self.episode_last = torch.from_numpy(episode_last)

    def __len__(self) -> int:
        return len(self.observations)

    @property
    def obs_dim(self) -> int:
        return self.observations.shape[1]

    @property
    def action_dim(self) -> int:
        return self.actions.shape[1]

    def gather(self, indices: torch.Tensor, chunk_size: int) -> dict[str, torch.Tensor]:
        """A batch: the observation at each index and the next `chunk_size` actions of its episode.

        Steps past the episode's end repeat its last action and are flagged in `action_is_pad`.
        """
        steps = indices[:, None] + torch.arange(chunk_size)[None, :]
        last = self.episode_last[indices][:, None]
        return {
            OBS_KEY: self.observations[indices],
            ACTION_KEY: self.actions[torch.minimum(steps, last)],
            PAD_KEY: steps > last,
        }

    def stats(self) -> dict[str, dict[str, torch.Tensor]]:
        """Mean and std per feature, for the normalization processors."""
        return {
            key: {"mean": data.mean(0), "std": data.std(0).clamp_min(1e-6)}
            for key, data in ((OBS_KEY, self.observations), (ACTION_KEY, self.actions))
        }


def load_dataset(config: DatasetConfig) -> DemonstrationDataset:
    """Read the cached episodes, generating them first when the cache is missing."""
    path = config.cache_path()
    if not path.exists():
        _write_atomically(path, _generate(config))
    with np.load(path) as data:
        return DemonstrationDataset(data["observations"], data["actions"], data["episode_last"])


def _generate(config: DatasetConfig) -> dict[str, np.ndarray]:
    observations, actions, episode_last = [], [], []
    count = 0
    for episode in range(config.episodes):
        obs, act, _ = sim.rollout(sim.expert_action, seed=config.seed * 100_003 + episode, noise=config.noise)
        observations.append(obs)
        actions.append(act)
        count += len(obs)
        episode_last.append(np.full(len(obs), count - 1, dtype=np.int64))
    return {
        "observations": np.concatenate(observations),
        "actions": np.concatenate(actions),
        "episode_last": np.concatenate(episode_last),
    }


def _write_atomically(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, allow_pickle=False, **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
