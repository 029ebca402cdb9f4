"""A VLA policy's features both ways between our config fields and LeRobot's config.json.

Ours: `input_features` lists the state, the cameras (in token order) and `task`, the cameras' frame
shapes are `image_shapes`, the state and action widths `obs_dim` / `action_dim`. LeRobot's: typed
`input_features` (`{"observation.state": {"type": "STATE", "shape": [4]}, "observation.images.top":
{"type": "VISUAL", "shape": [3, 24, 40]}, ...}`) and `output_features`, where the blank camera slots a
policy adds (`empty_cameras`) appear as `observation.images.empty_camera_<i>`, which no data holds.
SmolVLA and pi0/pi0.5 share both directions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeVar

from trainer.config.policy import LEROBOT_RUN_FIELDS
from trainer.data.dataset import ACTION_KEY, ALL_CAMERAS, OBS_KEY, TASK_KEY, is_camera
from trainer.errors import ConfigError

# The names LeRobot gives the `empty_cameras` blank slots in its saved input_features (no data has them).
EMPTY_CAMERA = "observation.images.empty_camera_"


class CameraConfig(Protocol):
    """The fields of a camera policy's config the helpers read."""

    input_features: list[str]
    image_shapes: dict[str, list[int]]
    path: str | None


Config = TypeVar("Config", bound=CameraConfig)


def camera_names(input_features: list[str]) -> list[str]:
    """The cameras among `input_features`, in their order (the order of their tokens)."""
    return [name for name in input_features if is_camera(name) and name != ALL_CAMERAS]


def with_frame_shapes(config: Config, shapes: dict[str, list[int]]) -> Config:
    """`config` with the cameras' frame shapes recorded; a checkpoint trained on fewer cameras than the
    data gives is refused (its prefix would change length and meaning)."""
    trained = list(config.image_shapes)
    if trained and config.path is not None:
        extra = [name for name in shapes if name not in trained]
        if extra:
            raise ConfigError(
                f"the data gives camera {extra[0]!r}, which the policy at {config.path} was not trained with "
                f"(it reads {', '.join(trained)}): name its cameras in --policy.input_features or rename "
                "the camera with --rename_map"
            )
    return dataclasses.replace(config, image_shapes={**config.image_shapes, **shapes})  # type: ignore[type-var]


def typed_features(
    obs_dim: int,
    cameras: list[str],
    image_shapes: dict[str, list[int]],
    action_dim: int,
    blank: list[int] | None = None,
    empty_cameras: int = 0,
) -> dict[str, dict[str, Any]]:
    """LeRobot's `input_features` (the state, each camera, then `empty_cameras` blank slots of shape
    `blank`) and `output_features` (the action)."""
    inputs: dict[str, Any] = {OBS_KEY: {"type": "STATE", "shape": [obs_dim]}} if obs_dim else {}
    for name in cameras:
        inputs[name] = {"type": "VISUAL", "shape": list(image_shapes.get(name, []))}
    for index in range(empty_cameras):
        inputs[f"{EMPTY_CAMERA}{index}"] = {"type": "VISUAL", "shape": list(blank or [])}
    return {
        "input_features": inputs,
        "output_features": {ACTION_KEY: {"type": "ACTION", "shape": [action_dim]}},
    }


def fields_from_lerobot(saved: dict[str, Any], dropped: tuple[str, ...] = ()) -> dict[str, Any]:
    """LeRobot's config.json as our fields: its run fields, `output_features` and `dropped` left out,
    its typed features as our input names (the state first, the cameras but the blank slots, the task),
    `image_shapes`, `obs_dim` and `action_dim`."""
    features = saved.get("input_features")
    out = {
        k: v
        for k, v in saved.items()
        if k not in LEROBOT_RUN_FIELDS and k not in ("output_features", *dropped)
    }
    names: list[str] = []
    shapes: dict[str, list[int]] = {}
    obs_dim = 0
    for name, feature in (features if isinstance(features, dict) else {}).items():
        kind = feature.get("type") if isinstance(feature, dict) else None
        shape = list(feature.get("shape", [])) if isinstance(feature, dict) else []
        if kind == "STATE":
            names.insert(0, name)
            obs_dim = int(shape[0]) if shape else 0
        elif kind == "VISUAL" and not name.startswith(EMPTY_CAMERA):
            names.append(name)
            shapes[name] = [int(s) for s in shape]
    action = (saved.get("output_features") or {}).get(ACTION_KEY, {})
    out.update(
        input_features=[*names, TASK_KEY],
        image_shapes=shapes,
        obs_dim=obs_dim,
        action_dim=int(action.get("shape", [0])[0]) if isinstance(action, dict) else 0,
    )
    return out
