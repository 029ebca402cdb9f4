"""`trainer.load_policy(path)`: from any saved form of a policy to one that acts on raw observations.

The path may be a step directory, `checkpoints/last`, a run's output_dir, a `pretrained_model/`, a
`ckpt convert --output` or `ckpt merge-adapter -o` directory, a published copy, or a Hub repo id (read
through the Hugging Face cache). Weights come through ckpt_tools in whatever format the checkpoint
holds (safetensors, DCP shards, a PEFT adapter merged into the base its adapter_config.json records),
so every form of one checkpoint gives the same actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import draccus
import torch

import ckpt_tools
from ckpt_tools import layout
from trainer.config.registry import register_import_path
from trainer.data.dataset import ACTION_KEY, OBS_KEY
from trainer.data.processors import Processor, observation_batch
from trainer.errors import ConfigError
from trainer.policies import Policy, PolicyConfig, build_policy, pretrained, upgrade_policy_config


@dataclass
class LoadedPolicy:
    """A policy with the processors it was trained with, in eval mode on `device`."""

    policy: Policy
    preprocessor: Processor
    postprocessor: Processor
    device: torch.device

    @property
    def config(self) -> PolicyConfig:
        return self.policy.config

    @property
    def input_features(self) -> list[str]:
        """The observation features `select_action` reads (vectors concatenated in this order)."""
        return list(self.config.input_features) or [OBS_KEY]

    @torch.no_grad()
    def select_action(self, observation: Mapping[str, Any]) -> torch.Tensor:
        """The next action, in the dataset's units, for raw observations: a dict holding each input
        feature, batched or not (an unbatched one gives an `[action_dim]` action). Vectors are `[n]` or
        `[B, n]`; camera frames uint8 `H x W x 3` arrays as a camera gives them, or `(C, H, W)` tensors
        (uint8, or float in [0, 1] as LeRobot's dataset gives them), with a leading batch dimension or
        not (processors.observation_batch). ACT acts from its action queue: call `reset()` between
        episodes."""
        batch, single = observation_batch(observation, self.input_features)
        action = self.act(batch)
        return action[0] if single else action

    @torch.no_grad()
    def act(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Actions (dataset units) for a raw batch: `observation.state` with the vector features
        concatenated, cameras as (B, C, H, W) frames."""
        raw = {name: value.to(self.device) for name, value in batch.items() if name in self._batch_keys}
        normalized = self.preprocessor(raw)
        dtype = _param_dtype(self.policy)
        action = self.policy.select_action({k: v.to(dtype) for k, v in normalized.items()}).float()
        return self.postprocessor({ACTION_KEY: action})[ACTION_KEY]

    def reset(self) -> None:
        """Start a new episode (empties ACT's action queue and temporal ensemble)."""
        self.policy.reset()

    @property
    def _batch_keys(self) -> set[str]:
        return {OBS_KEY, *self.input_features}


def load_policy(path: str, device: str | torch.device = "cpu") -> LoadedPolicy:
    """Load the policy saved at `path` (see the module docstring for the accepted forms)."""
    local = pretrained.resolve(path)
    try:
        checkpoint = ckpt_tools.open_checkpoint(local)
        saved = checkpoint.policy_config()
        processors = ckpt_tools.load_processors(local)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    config = _policy_config(saved, path)
    policy = build_policy(config, config.obs_dim, config.action_dim)
    pretrained.load_weights(policy, path)
    missing = [name for name in (layout.PREPROCESSOR, layout.POSTPROCESSOR) if name not in processors]
    if missing:
        raise ConfigError(
            f"{path} holds no {missing[0]}.json: it was saved without its normalization statistics"
        )
    pre, post = (
        Processor.from_state(processors[n].config, processors[n].step_tensors)
        for n in (layout.PREPROCESSOR, layout.POSTPROCESSOR)
    )
    target = torch.device(device)
    policy.to(target).eval()
    return LoadedPolicy(policy=policy, preprocessor=pre, postprocessor=post, device=target)


def _policy_config(saved: dict[str, Any], path: str) -> PolicyConfig:
    saved = upgrade_policy_config(saved)
    policy_type = saved.get("type")
    if not isinstance(policy_type, str):
        raise ConfigError(f"{path}: its config.json names no policy type")
    register_import_path(PolicyConfig, policy_type, "the saved policy type")
    try:
        config = draccus.decode(PolicyConfig, saved)
    except Exception as exc:  # draccus reports unknown fields and bad values in several types
        raise ConfigError(
            f"{path}: its config.json does not describe a policy ({' '.join(str(exc).split())})"
        ) from None
    assert isinstance(config, PolicyConfig)
    return config


def _param_dtype(policy: Policy) -> torch.dtype:
    return next(policy.parameters()).dtype
