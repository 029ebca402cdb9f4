"""The policy interface and the policy type registry.

A policy is an `nn.Module` built from its config and the dataset's feature sizes. It returns
`(loss, metrics)` from `forward(batch)` and an action from `select_action(obs)`. Two class attributes
tell the engine how to shard it: `_fsdp_wrap_modules` (class names that become FSDP units) and
`_fsdp_forward_methods` (entry points other than `forward` that need the sharded parameters gathered).
"""

from __future__ import annotations

import builtins
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import draccus
import torch
from torch import nn

from trainer.config import registry
from trainer.config.accelerator import dtype_flag
from trainer.errors import ConfigError

# PolicyConfig fields that say where a run publishes, not what the policy is.
PUBLISH_FIELDS = ("push_to_hub", "repo_id", "private")


@dataclass
class PolicyConfig(draccus.ChoiceRegistry):
    """Base of every policy config; `--policy.type` picks the subclass."""

    dropout: float = 0.1
    """Dropout probability inside the policy (0 makes a run deterministic across topologies)."""
    dtype: str | None = None
    """Cast the policy's parameters to this dtype (float32, bfloat16, float16, or fp32, bf16, fp16);
    autocast stays owned by --accelerator.mixed_precision."""
    obs_dim: int = 0
    """Observation size; 0 takes it from the dataset (the saved config.json records the value)."""
    action_dim: int = 0
    """Action size; 0 takes it from the dataset."""
    input_features: list[str] = field(default_factory=list)
    """Observation features concatenated, in this order, into the policy's input vector; empty takes
    every float `observation.*` feature of the dataset in its metadata's order (config.json records
    the list)."""
    path: str | None = None
    """Start from this pretrained policy: a local model or step directory, or a Hub repo id (its
    config.json supplies the other policy fields; flags still override them)."""
    push_to_hub: bool = False
    """Publish the final checkpoint's model, processors, configs and a model card to --policy.repo_id
    at the end of training (docs/publishing.md)."""
    repo_id: str | None = None
    """Hub repo (`namespace/name`) or fsspec target (`s3://bucket/prefix`, a local path) to publish to."""
    private: bool = False
    """Create the Hub repo private (an existing repo keeps its visibility)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--policy.dropout must be in [0, 1), got {self.dropout}")
        self.dtype = dtype_flag("--policy.dtype", self.dtype)
        if self.push_to_hub and not self.repo_id:
            raise ConfigError(
                "--policy.push_to_hub=true needs --policy.repo_id=namespace/name (or an fsspec URL)"
            )

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    @property
    def chunk_size(self) -> int:
        """Actions predicted per observation."""
        return 1

    def policy_class(self) -> builtins.type[Policy]:  # `type` here is the property above
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The policy's `config.json`: its type and every field but the publish settings, which belong
        to the run (train_config.json): a run started from a published model with --policy.path must
        not publish over that model's repo."""
        fields = dataclasses.asdict(self)
        for name in PUBLISH_FIELDS:
            fields.pop(name)
        return {"type": self.type, **fields}


class Policy(nn.Module):
    """Base class of the policies the engine trains."""

    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ()
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action",)

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def select_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The next action for a batch of (normalized) observations."""
        raise NotImplementedError


def build_policy(config: PolicyConfig, obs_dim: int, action_dim: int) -> Policy:
    """The policy in its dtype, with the feature sizes the config left open (0) taken from the
    arguments. The caller's config is not edited: the policy gets a copy (a run's plan records the
    sizes in its own config, plan.resolve_policy_features)."""
    config = dataclasses.replace(
        config, obs_dim=config.obs_dim or obs_dim, action_dim=config.action_dim or action_dim
    )
    policy = config.policy_class()(config)
    if config.dtype is not None:
        policy.to(getattr(torch, config.dtype))
    return policy


def register_import_path(type_name: str) -> None:
    """Make `--policy.type=package.module:ConfigClass` usable (config/registry.py)."""
    registry.register_import_path(PolicyConfig, type_name, "--policy.type")


def known_types() -> list[str]:
    return registry.known_types(PolicyConfig)
