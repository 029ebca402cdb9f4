"""Everything about LeRobot 0.6.1's schema for FastWAM, as plain functions the config's hooks call:
its config.json both ways and its processor pipeline. Its tensor names are ours (policy.py), so the
weights need no renaming either way."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from trainer.config.policy import LEROBOT_RUN_FIELDS
from trainer.data.pipeline import lerobot_schema
from trainer.policies.vla import features as vla_features

# Our fields LeRobot's FastWAMConfig lacks: kept in our config.json, left out of an export's.
OURS_ONLY = (
    "dropout", "dtype", "obs_dim", "action_dim", "proprio_dim", "input_features", "path", "push_to_hub",
    "repo_id", "private", "device", "image_shapes",
)  # fmt: skip


class FastWAMFields(Protocol):
    """What these functions read of a FastWAMConfig (config.py calls them, so this module imports it not)."""

    n_obs_steps: int
    image_size: tuple[int, int]
    action_dim: int
    device: str | None
    normalization_mapping: dict[str, str]

    @property
    def type(self) -> str: ...

    @property
    def cameras(self) -> list[str]: ...

    @property
    def state_dim(self) -> int | None: ...


def config_from_lerobot(saved: dict[str, Any]) -> dict[str, Any]:
    """A LeRobot FastWAM config.json (its typed features) as our fields; ours as it is."""
    if not isinstance(saved.get("input_features"), dict):
        return saved
    return vla_features.fields_from_lerobot(saved)


def typed_features(config: FastWAMFields) -> dict[str, dict[str, Any]]:
    """LeRobot's typed features: each camera at its share of `image_size` (what LeRobot's
    `set_dataset_feature_metadata` declares), the state at the proprio width, the action."""
    height, width = config.image_size
    cameras = config.cameras
    shapes = {name: [3, height, width // len(cameras)] for name in cameras}
    return vla_features.typed_features(config.state_dim or 0, cameras, shapes, config.action_dim)


def config_to_lerobot(config: FastWAMFields) -> dict[str, Any]:
    """LeRobot 0.6.1's FastWAMConfig schema (`trainer export`): its fields, the typed features, its
    run fields at their defaults."""
    own = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in OURS_ONLY}  # type: ignore[arg-type]
    return {
        "type": config.type,
        "n_obs_steps": config.n_obs_steps,
        **typed_features(config),
        "device": config.device or "cpu",
        **LEROBOT_RUN_FIELDS,
        "action_dim": config.action_dim,
        "proprio_dim": config.state_dim,
        **{name: list(value) if isinstance(value, tuple) else value for name, value in own.items()},
    }


def pipeline(config: FastWAMFields) -> lerobot_schema.LeRobotPipeline:
    """LeRobot's `make_fastwam_pre_post_processors`: rename, batch axis, device, then the normalizer
    (cameras IDENTITY: the policy resizes them); after the unnormalizer, the device step alone."""
    typed = typed_features(config)
    before = (lerobot_schema.rename(), lerobot_schema.to_batch(), lerobot_schema.device())
    features = {**typed["input_features"], **typed["output_features"]}
    return lerobot_schema.LeRobotPipeline(before, features, dict(config.normalization_mapping))
