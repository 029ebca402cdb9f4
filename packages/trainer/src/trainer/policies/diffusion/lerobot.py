"""Diffusion Policy's LeRobot form (`DiffusionConfig.lerobot_adapter`): LeRobot 0.6.1's DiffusionConfig
schema both ways (typed features for the state, the environment state and the cameras; LeRobot's run
fields at their defaults) and its processor pipeline. The tensor names are LeRobot's already, so they
pass as they are both ways."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.config.policy import LEROBOT_RUN_FIELDS, LeRobotAdapter
from trainer.data.dataset import ACTION_KEY, ENV_KEY, OBS_KEY
from trainer.data.pipeline import lerobot_schema
from trainer.errors import ConfigError
from trainer.policies.diffusion.config import DiffusionConfig, DiffusionFeatures

# Our fields LeRobot's DiffusionConfig lacks: the shapes are its typed features, the rest stay in
# train_config.json (its from_pretrained refuses a field it does not know).
_OURS_ONLY = (
    "dropout", "dtype", "obs_dim", "action_dim", "path", "input_features", "image_shapes", "env_state_dim",
)  # fmt: skip


class DiffusionAdapter(LeRobotAdapter[DiffusionConfig]):
    """LeRobot's DiffusionConfig and `make_diffusion_pre_post_processors`."""

    def config_from_lerobot(
        self, saved: dict[str, Any], preprocessor: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A LeRobot config.json as DiffusionConfig's fields: its typed features become the input names
        and sizes (their shapes: `DiffusionFeatures.from_lerobot`; the environment state read at the end
        of `observation.state`), its run fields are dropped. Ours passes as it is."""
        inputs = saved.get("input_features")
        if not isinstance(inputs, dict):
            return saved  # already ours
        own = {f.name for f in dataclasses.fields(DiffusionConfig)}
        out = {k: v for k, v in saved.items() if k in {*own, "type"} and k not in LEROBOT_RUN_FIELDS}
        features = DiffusionFeatures.from_lerobot(saved)
        vectors = [name for name in (OBS_KEY, ENV_KEY) if name in inputs]
        out.update(
            input_features=[*vectors, *(name for name in inputs if name not in vectors)],
            image_shapes={name: list(shape) for name, shape in features.cameras.items()},
            obs_dim=features.state_dim + features.env_state_dim,
            env_state_dim=features.env_state_dim,
            action_dim=features.action_dim,
        )
        return out

    def config_to_lerobot(self, config: DiffusionConfig) -> dict[str, Any]:
        """LeRobot 0.6.1's DiffusionConfig schema (`trainer export`): the state, the environment state
        and the cameras as typed features, LeRobot's run fields at its defaults. LeRobot's policy reads
        one `observation.state` (and one `observation.environment_state`), so a policy concatenating
        other vectors, or none, is refused."""
        readable = [OBS_KEY, ENV_KEY] if config.env_state_dim else [OBS_KEY]
        if config.vectors != readable:
            raise ConfigError(
                f"LeRobot's Diffusion Policy reads the robot state as one {OBS_KEY} (and {ENV_KEY} with "
                f"--policy.env_state_dim), and this one reads {config.vectors or 'no vector'}: train it with "
                f"--policy.input_features listing {' and '.join(readable)} and cameras"
            )
        own = {
            f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _OURS_ONLY
        }
        return {
            "type": config.type,
            **{name: list(value) if isinstance(value, tuple) else value for name, value in own.items()},
            **_typed_features(config),
            **LEROBOT_RUN_FIELDS,
        }

    def pipeline(self, config: DiffusionConfig) -> lerobot_schema.LeRobotPipeline:
        """LeRobot's `make_diffusion_pre_post_processors`: rename, batch axis, device, then the normalizer
        over the state, the cameras and the action as normalization_mapping says."""
        features = _typed_features(config)
        before = (lerobot_schema.rename(), lerobot_schema.to_batch(), lerobot_schema.device())
        typed = {**features["input_features"], **features["output_features"]}
        return lerobot_schema.LeRobotPipeline(before, typed, dict(config.normalization_mapping))


def _typed_features(config: DiffusionConfig) -> dict[str, dict[str, Any]]:
    """config.json's `input_features` (the state vector, the environment state, then each camera) and
    `output_features`."""
    state = config.obs_dim - config.env_state_dim
    inputs: dict[str, Any] = {OBS_KEY: {"type": "STATE", "shape": [state]}} if state else {}
    if config.env_state_dim:
        inputs[ENV_KEY] = {"type": "ENV", "shape": [config.env_state_dim]}
    for name in config.cameras:
        inputs[name] = {"type": "VISUAL", "shape": list(config.image_shapes.get(name, []))}
    return {
        "input_features": inputs,
        "output_features": {ACTION_KEY: {"type": "ACTION", "shape": [config.action_dim]}},
    }
