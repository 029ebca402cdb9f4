"""Pre/post-processors: normalization with dataset statistics, kept beside the weights.

The preprocessor maps raw observations (and, in training, target actions) to zero mean and unit
variance; the postprocessor maps the policy's actions back to torques. A camera
(`observation.images.*`, uint8 in the batch) is first scaled to [0, 1] floats, then normalized with its
per-channel (C, 1, 1) statistics. Their statistics are saved with
every checkpoint, so a policy loaded for evaluation sees inputs on the scale it was trained on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from trainer.config.policy import ProcessorSchema
from trainer.data.dataset import ACTION_KEY, OBS_KEY, TASK_KEY, frames_as_float, is_camera, task_bytes
from trainer.data.pipeline.lerobot_schema import RANGES
from trainer.errors import ConfigError

PREPROCESSOR_KEYS = (OBS_KEY, ACTION_KEY)
ENV_KEY = "observation.environment_state"  # LeRobot's environment state, a separate vector there
POSTPROCESSOR_KEYS = (ACTION_KEY,)


class Normalize:
    """One processor step: `(x - mean) / std` per feature (or its inverse)."""

    def __init__(
        self, stats: dict[str, dict[str, torch.Tensor]], keys: tuple[str, ...], inverse: bool
    ) -> None:
        # mean and std alone: what the step applies and saves (a dataset's min/max reach a MIN_MAX
        # policy's processors as mean/std through `PolicyConfig.normalization_stats`)
        self.stats = {key: {name: stats[key][name] for name in ("mean", "std")} for key in keys}
        self.inverse = inverse

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        for key, s in self.stats.items():
            if key in out:
                value = frames_as_float(out[key])  # a camera arrives as decoded (uint8)
                mean, std = s["mean"].to(value.device), s["std"].to(value.device)
                out[key] = value * std + mean if self.inverse else (value - mean) / std
        return out

    def config(self) -> dict[str, Any]:
        return {"type": "unnormalize" if self.inverse else "normalize", "features": sorted(self.stats)}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"{key}.{name}": t.contiguous() for key, s in self.stats.items() for name, t in s.items()}


class Processor:
    """An ordered list of steps; its state is (config, one tensor dict per step): in LeRobot 0.6.1's
    pipeline schema when the policy has a LeRobot counterpart (`lerobot`, one normalize step), else
    ours (`{"steps": [{"type": "normalize", "features": [...]}]}`, docs/format.md)."""

    def __init__(self, steps: list[Normalize], lerobot: ProcessorSchema | None = None) -> None:
        self.steps = steps
        self.lerobot = lerobot

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for step in self.steps:
            batch = step(batch)
        return batch

    def state(self) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        if self.lerobot is not None:
            (step,) = self.steps
            write = self.lerobot.postprocessor if step.inverse else self.lerobot.preprocessor
            return write(step.stats)
        return {"steps": [step.config() for step in self.steps]}, [step.tensors() for step in self.steps]

    @classmethod
    def from_state(
        cls, config: Any, step_tensors: list[dict[str, torch.Tensor]], sizes: dict[str, int] | None = None
    ) -> Processor:
        """The processor `state()` described (read back from a checkpoint, so checked first: the
        config's steps against the step files, each feature's `mean` and `std` present, 1-D, of the
        size `sizes` gives for it). Raises `ConfigError` naming the first problem."""
        steps_config = config.get("steps") if isinstance(config, dict) else None
        if isinstance(steps_config, list) and any(
            isinstance(s, dict) and "registry_name" in s for s in steps_config
        ):
            config, step_tensors = _from_lerobot(steps_config, step_tensors)
            steps_config = config["steps"]
        if not isinstance(steps_config, list) or len(steps_config) != len(step_tensors):
            raise ConfigError(
                f"its processor config lists {_count(steps_config)} steps for {len(step_tensors)} step files"
            )
        steps = []
        for index, (step, tensors) in enumerate(zip(steps_config, step_tensors, strict=True)):
            features, inverse = _step_config(step, index)
            stats: dict[str, dict[str, torch.Tensor]] = {}
            for name, tensor in tensors.items():
                key, _, stat = name.rpartition(".")
                stats.setdefault(key, {})[stat] = tensor
            for feature in features:
                _check_stats(stats.get(feature, {}), feature, index, (sizes or {}).get(feature))
            steps.append(Normalize(stats, features, inverse=inverse))
        return cls(steps)


# LeRobot's processor steps that hold normalization statistics; its other steps (rename, batch axis,
# the task's newline and tokenizer, device) are what the policy and the input pipeline do here.
_LEROBOT_NORMALIZERS = {"normalizer_processor": False, "unnormalizer_processor": True}


def _from_lerobot(
    steps: list[Any], step_tensors: list[dict[str, torch.Tensor]]
) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
    """LeRobot's processor (its `policy_preprocessor.json` steps and their state files) as our
    normalize steps: MEAN_STD features divided by `std + eps` (LeRobot's normalizer; its unnormalizer
    multiplies by `std` alone), MIN_MAX ones and QUANTILES (pi0.5's) onto [-1, 1] as the same affine
    map (`min_max_as_mean_std`, over min/max or q01/q99), IDENTITY cameras kept on [0, 1] (mean 0, std 1)."""
    ours: list[dict[str, Any]] = []
    tensors: list[dict[str, torch.Tensor]] = []
    for index, (step, state) in enumerate(zip(steps, step_tensors, strict=False)):
        inverse = _LEROBOT_NORMALIZERS.get(str(step.get("registry_name"))) if isinstance(step, dict) else None
        if inverse is None:
            continue
        config = step.get("config") if isinstance(step.get("config"), dict) else {}
        features, norm_map = config.get("features") or {}, config.get("norm_map") or {}
        range_eps = float(config.get("eps", 1e-8))
        eps = 0.0 if inverse else range_eps
        names, stats = [], {}
        for name, feature in features.items():
            mode = norm_map.get(feature.get("type") if isinstance(feature, dict) else None, "IDENTITY")
            if mode == "MEAN_STD":
                if f"{name}.mean" not in state or f"{name}.std" not in state:
                    raise ConfigError(
                        f"its processor step {index} has no {name}.mean/std tensor in its state file"
                    )
                stats[f"{name}.mean"], stats[f"{name}.std"] = (
                    state[f"{name}.mean"],
                    state[f"{name}.std"] + eps,
                )
            elif mode in RANGES:
                low, high = (f"{name}.{stat}" for stat in RANGES[mode])
                if low not in state or high not in state:
                    bounds = "/".join(RANGES[mode])
                    raise ConfigError(
                        f"its processor step {index} has no {name}.{bounds} tensor in its state file"
                    )
                stats[f"{name}.mean"], stats[f"{name}.std"] = min_max_as_mean_std(
                    state[low], state[high], range_eps
                )
            elif mode == "IDENTITY" and is_camera(name):
                channels = int(feature.get("shape", [3])[0])
                stats[f"{name}.mean"], stats[f"{name}.std"] = (
                    torch.zeros(channels, 1, 1),
                    torch.ones(channels, 1, 1),
                )
            elif mode != "IDENTITY":
                raise ConfigError(
                    f"its processor normalizes {name} with {mode}, which is not supported (MEAN_STD, MIN_MAX, QUANTILES or IDENTITY)"
                )
            else:
                continue
            names.append(name)
        if ENV_KEY in features:
            names = _merge_environment_state(names, stats, features)
        ours.append({"type": "unnormalize" if inverse else "normalize", "features": names})
        tensors.append(stats)
    return {"steps": ours}, tensors


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


def _merge_environment_state(
    names: list[str], stats: dict[str, torch.Tensor], features: dict[str, Any]
) -> list[str]:
    """LeRobot's separate `observation.environment_state` statistics appended to `observation.state`'s
    (our batch carries both in one vector, the robot's first, as act_lerobot.py reads LeRobot's ACT);
    a feature left unnormalized (IDENTITY: LeRobot's ACT does not normalize ENV) gets mean 0, std 1."""
    parts: dict[str, list[torch.Tensor]] = {"mean": [], "std": []}
    for name in (OBS_KEY, ENV_KEY):
        width = int((features.get(name) or {"shape": [0]})["shape"][0])
        for stat, fill in (("mean", torch.zeros), ("std", torch.ones)):
            parts[stat].append(stats.pop(f"{name}.{stat}", fill(width)))
    stats[f"{OBS_KEY}.mean"], stats[f"{OBS_KEY}.std"] = torch.cat(parts["mean"]), torch.cat(parts["std"])
    return [OBS_KEY, *(n for n in names if n not in (OBS_KEY, ENV_KEY))]


def _count(value: Any) -> str:
    return str(len(value)) if isinstance(value, list) else "no list of"


def _step_config(step: Any, index: int) -> tuple[tuple[str, ...], bool]:
    """(features, inverse) of one saved step: `{"type": "normalize"|"unnormalize", "features": [...]}`."""
    kind = step.get("type") if isinstance(step, dict) else None
    features = step.get("features") if isinstance(step, dict) else None
    if kind not in ("normalize", "unnormalize") or not (
        isinstance(features, list) and all(isinstance(f, str) for f in features)
    ):
        raise ConfigError(f"its processor step {index} is not a normalize step naming its features")
    return tuple(features), kind == "unnormalize"


def _check_stats(stats: dict[str, torch.Tensor], feature: str, index: int, size: int | None) -> None:
    for stat in ("mean", "std"):
        tensor = stats.get(stat)
        if tensor is None:
            raise ConfigError(f"its processor step {index} has no {feature}.{stat} tensor in its step file")
        shape_ok = tensor.ndim == 1 or (
            is_camera(feature) and tensor.ndim == 3 and tensor.shape[1:] == (1, 1)
        )
        if not shape_ok or (size is not None and tensor.shape[0] != size):
            raise ConfigError(
                f"its processor step {index}'s {feature}.{stat} has shape {list(tensor.shape)}, but the "
                f"policy's {feature} has {size} values"
            )


def build_processors(
    stats: dict[str, dict[str, torch.Tensor]], lerobot: ProcessorSchema | None = None
) -> tuple[Processor, Processor]:
    """(preprocessor, postprocessor) for a dataset's statistics (its cameras' included), saved in
    LeRobot's schema when `lerobot` describes the policy's pipeline there."""
    cameras = tuple(sorted(key for key in stats if is_camera(key)))
    return (
        Processor([Normalize(stats, PREPROCESSOR_KEYS + cameras, inverse=False)], lerobot),
        Processor([Normalize(stats, POSTPROCESSOR_KEYS, inverse=True)], lerobot),
    )


def observation_batch(
    observation: Mapping[str, Any], features: Sequence[str]
) -> tuple[dict[str, torch.Tensor], bool]:
    """Raw observations as the batch the preprocessor takes, and whether they were one unbatched
    observation. Vector features ((n,) or (B, n), arrays or tensors) are concatenated in `features`'
    order into `observation.state`; the task text (`task`, for a language policy) is a string or one per
    observation. A camera is accepted as a camera gives it, a uint8 numpy array
    ((B,) H, W, C), or as a tensor ((B,) C, H, W): uint8, or float in [0, 1] as LeRobot's dataset gives
    it; the preprocessor scales uint8 to [0, 1]."""
    missing = [name for name in features if name not in observation]
    if missing:
        raise KeyError(f"the observation lacks {missing[0]!r}; the policy reads {list(features)}")
    vectors = [
        torch.as_tensor(np.asarray(observation[n]), dtype=torch.float32)
        for n in features
        if not is_camera(n) and n != TASK_KEY
    ]
    cameras = {name: _frames(observation[name]) for name in features if is_camera(name)}
    single = vectors[0].ndim == 1 if vectors else next(iter(cameras.values())).ndim == 3
    batch = {name: frames[None] if single else frames for name, frames in cameras.items()}
    if TASK_KEY in features:  # the language instruction: a string, or one per observation
        task = observation[TASK_KEY]
        batch[TASK_KEY] = task_bytes([task] if isinstance(task, str) else list(task))
    if vectors:
        batch[OBS_KEY] = torch.cat([v.reshape(1, -1) if single else v for v in vectors], dim=-1)
    return batch, single


def _frames(value: Any) -> torch.Tensor:
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:  # a camera's H x W x C
        return torch.from_numpy(np.ascontiguousarray(np.moveaxis(value, -1, -3)))
    frames = torch.as_tensor(value)
    return frames if frames.dtype == torch.uint8 else frames.float()
