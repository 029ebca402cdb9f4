"""pi0's and pi0.5's LeRobot form (`PI0Config.lerobot_adapter`): LeRobot 0.6.1's PI0Config / PI05Config
schema both ways (the tokenizer LeRobot records in policy_preprocessor.json only read from there), the
tensor names both ways (`weights.py`: the paired decoder layers, LeRobot's key fixes, the `lm_head`s) and
the processor pipelines of `make_pi0_pre_post_processors` / `make_pi05_pre_post_processors`."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import torch
from torch import nn

from trainer.config.policy import LEROBOT_RUN_FIELDS, LeRobotAdapter
from trainer.data.dataset import TASK_KEY
from trainer.data.pipeline import lerobot_schema
from trainer.policies.common.vla import features as vla_features
from trainer.policies.pi import weights
from trainer.policies.pi.config import PI0Config

# Our fields LeRobot's PI0Config lacks: kept in our config.json, left out of an export's.
_OURS_ONLY = (
    "dropout", "obs_dim", "action_dim", "input_features", "path", "push_to_hub", "repo_id", "private",
    "device", "tokenizer_name", "size_overrides", "image_shapes",
)  # fmt: skip
TOKENIZER_STEP = "tokenizer_processor"


class PiAdapter(LeRobotAdapter[PI0Config]):
    """LeRobot's pi0 (`pi05=False`) or pi0.5."""

    def __init__(self, pi05: bool) -> None:
        self.pi05 = pi05

    def config_from_lerobot(
        self, saved: dict[str, Any], preprocessor: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A LeRobot config.json (its typed features) as PI0Config's fields, with the tokenizer its
        policy_preprocessor.json names; ours (already these fields) as it is."""
        if not isinstance(saved.get("input_features"), dict):
            return saved
        out = vla_features.fields_from_lerobot(saved)
        steps = (preprocessor or {}).get("steps")
        names = [
            step["config"]["tokenizer_name"]
            for step in (steps if isinstance(steps, list) else [])
            if isinstance(step, dict)
            and step.get("registry_name") == TOKENIZER_STEP
            and isinstance(step.get("config"), dict)
            and isinstance(step["config"].get("tokenizer_name"), str)
        ]
        return {**out, "tokenizer_name": names[0]} if names else out

    def config_to_lerobot(self, config: PI0Config) -> dict[str, Any]:
        """LeRobot 0.6.1's PI0Config / PI05Config schema (`trainer export`): its fields, the typed
        features (the blank camera slots included, as LeRobot lists them), its run fields at their
        defaults; our tokenizer_name goes into the processor files, size_overrides nowhere."""
        own = {
            f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _OURS_ONLY
        }
        return {
            "type": config.type,
            "n_obs_steps": config.n_obs_steps,
            **_typed_features(config),
            "device": config.device,
            **LEROBOT_RUN_FIELDS,
            **{name: list(value) if isinstance(value, tuple) else value for name, value in own.items()},
        }

    def pipeline(self, config: PI0Config) -> lerobot_schema.LeRobotPipeline:
        """pi0: LeRobot's `make_pi0_pre_post_processors`: rename, batch axis, the task's newline, the
        tokenizer, device, relative actions (off), then the normalizer; after the unnormalizer, absolute
        actions (off). pi0.5: `make_pi05_pre_post_processors`: rename, batch axis, relative actions
        (off), the normalizer, then the state written into the prompt, the tokenizer and the device."""
        typed = _typed_features(config)
        inputs = {**typed["input_features"], **typed["output_features"]}
        absolute = (lerobot_schema.step("absolute_actions_processor", enabled=False),)
        if not self.pi05:
            before = (
                lerobot_schema.rename(),
                lerobot_schema.to_batch(),
                lerobot_schema.step("pi0_new_line_processor"),
                _tokenizer_step(config),
                lerobot_schema.device(),
                _relative_actions_step(config),
            )
            return lerobot_schema.LeRobotPipeline(
                before, inputs, dict(config.normalization_mapping), unnormalized=absolute
            )
        relative = (lerobot_schema.rename(), lerobot_schema.to_batch(), _relative_actions_step(config))
        after = (
            lerobot_schema.step("pi05_prepare_state_tokenizer_processor_step"),
            _tokenizer_step(config),
            lerobot_schema.device(),
        )
        return lerobot_schema.LeRobotPipeline(
            relative, inputs, dict(config.normalization_mapping), after=after, unnormalized=absolute
        )

    def is_lerobot_state(self, names: Collection[str]) -> bool:
        return weights.is_lerobots(names)

    def state_from_lerobot(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """LeRobot's (or openpi's) tensor names as ours, with LeRobot's key fixes; the two unused
        `lm_head`s dropped."""
        return weights.from_lerobot(state, self.pi05)

    def names_from_lerobot(self, names: Collection[str]) -> dict[str, str]:
        """LeRobot's (or openpi's) names are renamed and the `lm_head`s dropped, nothing more: such a
        checkpoint streams into the shards under these names."""
        return weights.names_from_lerobot(names, self.pi05)

    def state_to_lerobot(self, config: PI0Config, policy: nn.Module) -> dict[str, torch.Tensor]:
        """The weights under LeRobot's names, lm_heads included (what its strict load needs)."""
        return weights.to_lerobot(policy.state_dict(), config.sizes())


def _typed_features(config: PI0Config) -> dict[str, dict[str, Any]]:
    blank = [3, *config.image_resolution]
    return vla_features.typed_features(
        config.obs_dim, config.cameras, config.image_shapes, config.action_dim, blank, config.empty_cameras
    )


def _tokenizer_step(config: PI0Config) -> dict[str, Any]:
    return lerobot_schema.step(
        TOKENIZER_STEP,
        max_length=config.tokenizer_max_length,
        task_key=TASK_KEY,
        padding_side="right",
        padding="max_length",
        truncation=True,
        tokenizer_name=config.tokenizer_name,
    )


def _relative_actions_step(config: PI0Config) -> dict[str, Any]:
    return lerobot_schema.step(
        "relative_actions_processor",
        enabled=config.use_relative_actions,
        exclude_joints=list(config.relative_exclude_joints),
        action_names=config.action_feature_names,
    )
