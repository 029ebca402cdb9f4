"""The policy interface and the policy type registry.

A policy is an `nn.Module` built from its config and the dataset's feature sizes. It returns
`(loss, metrics)` from `forward(batch)` and an action from `select_action(obs)`. Two class attributes
tell the engine how to shard it: `_fsdp_wrap_modules` (class names that become FSDP units) and
`_fsdp_forward_methods` (entry points other than `forward` that need the sharded parameters gathered).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from trainer.config import registry
from trainer.config.policy import PolicyConfig


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
