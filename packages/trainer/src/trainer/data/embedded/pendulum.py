"""The embedded demonstration dataset: scripted-expert episodes of the sim task, cached on disk.

`--dataset.camera=true` switches to the camera task (data/embedded/sim.py): the episodes then also store the
camera's frames (`observation.images.top`, uint8), and the run's rollouts are scored on that task.
With `task` among `--policy.input_features` every frame also carries its task's language instruction
(`sim.instruction`), as a LeRobotDataset's frames carry theirs.

Generation is deterministic in (episodes, seed), so every rank may build or read the cache on its own:
the file is written under a temporary name and renamed, and identical bytes win any race.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.config.dataset import DatasetConfig
from trainer.data.dataset import (
    ALL_CAMERAS,
    OBS_KEY,
    TASK_KEY,
    ArrayDataset,
    check_input_features,
    is_camera,
)
from trainer.data.embedded import sim
from trainer.errors import ConfigError


@DatasetConfig.register_subclass("pendulum")
@dataclass
class PendulumConfig(DatasetConfig):
    """The embedded Pendulum-v1 swing-up demonstrations, generated offline by a scripted expert."""

    episodes: int = 50
    """Expert episodes of 200 steps each."""
    seed: int = 0
    """Seeds the episodes' start states (independent of the run's --seed)."""
    cache_dir: str | None = None
    """Where the generated episodes are cached; default $TRAINER_CACHE or ~/.cache/trainer."""
    noise: float = 0.5
    """Std of the torque noise executed (not recorded) while demonstrating, so the data
    covers recoveries."""
    eval_episodes: int = 8
    """Episodes rolled out at the end to compare the policy with a random one (split across
    ranks)."""
    camera: bool = False
    """Use the camera task: a 32x32 picture `observation.images.top` shows the target angle to reach
    and hold, which the state does not contain (100-step episodes, low gravity)."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ConfigError(f"--dataset.episodes must be >= 1, got {self.episodes}")
        if self.noise < 0:
            raise ConfigError(f"--dataset.noise must be >= 0, got {self.noise}")
        if self.eval_episodes < 0:
            raise ConfigError(f"--dataset.eval_episodes must be >= 0, got {self.eval_episodes}")

    @property
    def rollout_episodes(self) -> int:
        return self.eval_episodes

    @property
    def rollout_camera(self) -> bool:
        return self.camera

    def cache_path(self) -> Path:
        root = self.cache_dir or os.environ.get("TRAINER_CACHE") or Path.home() / ".cache" / "trainer"
        task = "_camera" if self.camera else ""
        return Path(root) / f"pendulum_v1{task}_ep{self.episodes}_seed{self.seed}_noise{self.noise:g}.npz"

    def load(self, input_features: Sequence[str] = ()) -> ArrayDataset:
        """Read the cached episodes, generating them first when the cache is missing."""
        cameras = [sim.CAMERA] if self.camera else []
        what = "the pendulum dataset" + ("" if self.camera else " (without --dataset.camera=true)")
        named = [name for name in input_features if name != ALL_CAMERAS]
        vectors = check_input_features(
            [n for n in named if not is_camera(n) and n != TASK_KEY], [OBS_KEY], what
        )
        named_cameras = check_input_features([n for n in named if is_camera(n)], cameras, what)
        chosen = named_cameras if any(is_camera(n) for n in named) else []
        language = [TASK_KEY] if TASK_KEY in input_features else []
        features = [*vectors, *(cameras if ALL_CAMERAS in input_features else chosen), *language]
        path = self.cache_path()
        if not path.exists():
            _write_atomically(path, _generate(self))
        with np.load(path) as data:
            ends = np.unique(data["episode_last"]) + 1
            lengths = np.diff(ends, prepend=0)
            images = {sim.CAMERA: data["frames"].transpose(0, 3, 1, 2)} if self.camera else None
            tasks = [sim.instruction(self.camera)] * len(data["actions"]) if language else None
            return ArrayDataset(
                data["observations"], data["actions"], lengths, features, images=images, tasks=tasks
            )


def _generate(config: PendulumConfig) -> dict[str, np.ndarray]:
    episodes = [
        sim.rollout(sim.expert_action, config.seed * 100_003 + i, config.noise, config.camera)
        for i in range(config.episodes)
    ]
    ends = np.cumsum([len(e.actions) for e in episodes])
    arrays = {
        "observations": np.concatenate([e.observations for e in episodes]),
        "actions": np.concatenate([e.actions for e in episodes]),
        "episode_last": np.repeat(ends - 1, [len(e.actions) for e in episodes]),
    }
    if config.camera:
        arrays["frames"] = np.concatenate([e.frames for e in episodes if e.frames is not None])
    return arrays


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
