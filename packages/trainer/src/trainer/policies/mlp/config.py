"""The MLP's config: its width and depth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.config import registry
from trainer.config.policy import PolicyConfig
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.policies.common.base import Policy


@PolicyConfig.register_subclass("mlp")
@dataclass
class MLPConfig(PolicyConfig):
    """Multi-layer perceptron."""

    hidden_dim: int = 128
    """Width of each hidden block."""
    blocks: int = 2
    """Hidden blocks (each one an FSDP wrap unit)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.blocks < 1 or self.hidden_dim < 1:
            raise ConfigError("--policy.blocks and --policy.hidden_dim must be >= 1")

    def policy_class(self) -> type[Policy]:
        return registry.imported("trainer.policies.mlp.policy", "MLPPolicy")
