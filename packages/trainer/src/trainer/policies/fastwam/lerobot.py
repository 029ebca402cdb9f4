"""FastWAM's LeRobot form (`FastWAMConfig.lerobot_adapter`): LeRobot 0.6.1's FastWAMConfig schema both
ways (typed features for the state and the cameras; LeRobot's run fields at their defaults) and its
processor pipeline. Its tensor names are ours (policy.py), so the weights pass as they are both ways."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.config.policy import LEROBOT_RUN_FIELDS, LeRobotAdapter
from trainer.data.pipeline import lerobot_schema
from trainer.policies.common.vla import features as vla_features
from trainer.policies.fastwam.config import FastWAMConfig

# Our fields LeRobot's FastWAMConfig lacks: kept in our config.json, left out of an export's.
_OURS_ONLY = (
    "dropout", "dtype", "obs_dim", "action_dim", "proprio_dim", "input_features", "path", "push_to_hub",
    "repo_id", "private", "device", "image_shapes",
)  # fmt: skip


class FastWAMAdapter(LeRobotAdapter[FastWAMConfig]):
    """LeRobot's FastWAMConfig and `make_fastwam_pre_post_processors`."""

    def config_from_lerobot(
        self, saved: dict[str, Any], preprocessor: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A LeRobot FastWAM config.json (its typed features) as our fields; ours as it is."""
        if not isinstance(saved.get("input_features"), dict):
            return saved
        return vla_features.fields_from_lerobot(saved)

    def config_to_lerobot(self, config: FastWAMConfig) -> dict[str, Any]:
        """LeRobot 0.6.1's FastWAMConfig schema (`trainer export`): its fields, the typed features, its
        run fields at their defaults."""
        own = {
            f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _OURS_ONLY
        }
        return {
            "type": config.type,
            "n_obs_steps": config.n_obs_steps,
            **_typed_features(config),
            "device": config.device or "cpu",
            **LEROBOT_RUN_FIELDS,
            "action_dim": config.action_dim,
            "proprio_dim": config.state_dim,
            **{name: list(value) if isinstance(value, tuple) else value for name, value in own.items()},
        }

    def pipeline(self, config: FastWAMConfig) -> lerobot_schema.LeRobotPipeline:
        """LeRobot's `make_fastwam_pre_post_processors`: rename, batch axis, device, then the normalizer
        (cameras IDENTITY: the policy resizes them); after the unnormalizer, the gripper toggle when
        `toggle_action_dimensions` names any (`FastWAMPolicy.finish_actions`), then the device step."""
        typed = _typed_features(config)
        before = (lerobot_schema.rename(), lerobot_schema.to_batch(), lerobot_schema.device())
        features = {**typed["input_features"], **typed["output_features"]}
        dimensions = [int(dim) for dim in config.toggle_action_dimensions]
        toggle = lerobot_schema.step("fastwam_action_toggle_processor", toggle_dimensions=dimensions)
        return lerobot_schema.LeRobotPipeline(
            before, features, dict(config.normalization_mapping), unnormalized=(toggle,) if dimensions else ()
        )


def _typed_features(config: FastWAMConfig) -> dict[str, dict[str, Any]]:
    """LeRobot's typed features: each camera at its share of `image_size` (what LeRobot's
    `set_dataset_feature_metadata` declares), the state at the proprio width, the action."""
    height, width = config.image_size
    cameras = config.cameras
    shapes = {name: [3, height, width // len(cameras)] for name in cameras}
    return vla_features.typed_features(config.state_dim or 0, cameras, shapes, config.action_dim)
