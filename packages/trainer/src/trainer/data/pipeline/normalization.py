"""The normalization modes a policy's `normalization_mapping` names (LeRobot's MEAN_STD, MIN_MAX,
QUANTILES, IDENTITY per feature type) as the one map the processors apply, `(x - mean) / std`: a
dataset's statistics mapped to that mean and std, by feature. The policies' configs import it; the
processors (data/pipeline/processors.py) and LeRobot's processor files (lerobot_schema.py) use it."""

from __future__ import annotations

from typing import Any

import torch

from trainer.data.dataset import ACTION_KEY, ENV_KEY, OBS_KEY, is_camera
from trainer.errors import ConfigError

# The state-file statistics bounding each range mode (LeRobot's MIN_MAX and QUANTILES normalization).
RANGES = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99")}
NORMALIZATION_MODES = ("MEAN_STD", "MIN_MAX", "QUANTILES", "IDENTITY")  # a normalization_mapping's modes
FEATURE_TYPES = {OBS_KEY: "STATE", ENV_KEY: "ENV", ACTION_KEY: "ACTION"}  # LeRobot's FeatureType names


def feature_type(name: str) -> str:
    """A feature's LeRobot type (VISUAL, STATE, ENV, ACTION): the key of `normalization_mapping`."""
    return "VISUAL" if is_camera(name) else FEATURE_TYPES.get(name, "STATE")


def mapped_stats(name: str, stats: dict[str, Any], mode: str) -> dict[str, Any]:
    """A feature's statistics as the mean/std the processors apply under `mode`: MEAN_STD as they
    are, IDENTITY mean 0 and std 1, MIN_MAX the dataset's min and max (QUANTILES its q01 and q99) as
    the map onto [-1, 1] (`min_max_as_mean_std`); a feature the dataset gives no such bounds for is one
    line."""
    if mode == "MEAN_STD":
        return stats
    if mode == "IDENTITY":
        return {"mean": torch.zeros_like(stats["mean"]), "std": torch.ones_like(stats["std"])}
    low, high = RANGES[mode]
    if low not in stats or high not in stats:
        raise ConfigError(
            f"--policy.normalization_mapping maps {name} to {mode}, but the dataset gives no {low}/{high} "
            "for it: map its type to MEAN_STD"
        )
    mean, std = min_max_as_mean_std(stats[low], stats[high])
    return {"mean": mean, "std": std}


def stats_by_type(stats: dict[str, dict[str, Any]], mapping: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every feature's statistics as the processors apply them, by its type's mode in a policy's
    `normalization_mapping` (LeRobot's; a type it lacks is IDENTITY): `mapped_stats` of each."""
    return {
        name: mapped_stats(name, value, mapping.get(feature_type(name), "IDENTITY"))
        for name, value in stats.items()
    }


def min_max_as_mean_std(
    low: torch.Tensor, high: torch.Tensor, eps: float = 1e-8
) -> tuple[torch.Tensor, torch.Tensor]:
    """LeRobot's MIN_MAX normalization, `2 (x - min) / (max - min) - 1` (inverse `(x + 1) / 2 (max - min)
    + min`), as the (mean, std) of our `(x - mean) / std`: the centre and the half-range, a zero range
    replaced by `eps` as LeRobot does. The same map, up to float rounding (about 1e-7 on [-1, 1])."""
    span = high - low
    span = torch.where(span == 0, torch.full_like(span, eps), span)
    return low + span / 2, span / 2
