"""The toy policy's config: what it decides from its fields alone (frames, preset, normalization)."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config.optim import AdamWConfig, ConstantConfig, OptimizerConfig, SchedulerConfig
from trainer.config.policy import PolicyConfig
from trainer.errors import ConfigError


@PolicyConfig.register_subclass("toy")  # the one registration line
@dataclass
class ToyConfig(PolicyConfig):
    """Predicts an action chunk from `n_obs_steps` consecutive states, like Diffusion Policy's history."""

    n_obs_steps: int = 2
    """Observation frames read: the current one and the n_obs_steps - 1 before it."""
    horizon: int = 3
    """Action frames trained on, starting at the first observation frame (LeRobot's Diffusion layout)."""
    hidden_dim: int = 16
    lr: float = 1e-2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_obs_steps < 1 or self.horizon < self.n_obs_steps:
            raise ConfigError("--policy.n_obs_steps must be >= 1 and --policy.horizon >= it")

    @property
    def chunk_size(self) -> int:
        return self.horizon

    @property
    def observation_delta_indices(self) -> list[int]:
        return list(range(1 - self.n_obs_steps, 1))

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(1 - self.n_obs_steps, self.horizon - self.n_obs_steps + 1))

    def get_optimizer_preset(self) -> OptimizerConfig:
        return AdamWConfig(lr=self.lr, weight_decay=0.0)

    def get_scheduler_preset(self) -> SchedulerConfig:
        return ConstantConfig(warmup_steps=0)

    def normalization_stats(self, stats: dict[str, dict]) -> dict[str, dict]:
        return stats  # the dataset's mean and std, as most policies

    def policy_class(self) -> type:
        from helpers.toy_policy.policy import ToyPolicy

        return ToyPolicy
