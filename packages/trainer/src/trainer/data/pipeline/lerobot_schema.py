"""Our processors written in LeRobot 0.6.1's pipeline schema (`policy_preprocessor.json` /
`policy_postprocessor.json`, docs/format.md), so that LeRobot's `make_pre_post_processors(config,
pretrained_path=DIR)` loads what we save and normalizes as we do.

A policy with a LeRobot counterpart (ACT, SmolVLA) describes its pipeline as LeRobot's factory builds it
from the policy's LeRobot adapter (`LeRobotAdapter.pipeline`): the steps ahead of the normalizer (rename,
batch axis, the task's newline and tokenizer, device), the typed features and the normalization modes.
The statistics are ours: our `(x - mean) / std` per feature written under the state-file names LeRobot's
normalizer reads for the feature's mode (`<key>.mean`/`.std`; a range mode's bounds `mean -/+ std`, the
same affine map). The other steps are done by the policy and the input pipeline here, so reading a file
back (`from_lerobot`, below) keeps only the normalizer and the unnormalizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ckpt_tools import layout
from trainer.config.policy import ProcessorFiles
from trainer.data.dataset import ACTION_KEY, ENV_KEY, OBS_KEY, is_camera
from trainer.data.pipeline.normalization import RANGES, min_max_as_mean_std
from trainer.errors import ConfigError

SCHEMA = "lerobot-0.6.1"  # what docs/format.md calls the processor files' schema version
NORMALIZER, UNNORMALIZER = "normalizer_processor", "unnormalizer_processor"
EPS = 1e-8  # LeRobot's NormalizerProcessorStep default, written as lerobot-train writes it
# The vector features of LeRobot's batch that are slices of our one `observation.state`, in its order.
_VECTOR_TYPES = ("STATE", "ENV")


def step(registry_name: str, **config: Any) -> dict[str, Any]:
    """One stateless step as LeRobot writes it: its registry name and constructor arguments."""
    return {"registry_name": registry_name, "config": config}


def rename() -> dict[str, Any]:
    return step("rename_observations_processor", rename_map={})


def to_batch() -> dict[str, Any]:
    return step("to_batch_processor")


def device() -> dict[str, Any]:
    """LeRobot's device step on the CPU (lerobot-eval and record override it by registry name)."""
    return step("device_processor", device="cpu", float_dtype=None)


@dataclass(frozen=True)
class LeRobotPipeline:
    """A policy's processors as LeRobot 0.6.1's factory builds them: `before` the preprocessor's steps
    ahead of its normalizer, `features` the typed input and output features as config.json lists them
    (`{"observation.state": {"type": "STATE", "shape": [4]}, ...}`), `norm_map` the mode per feature
    type (`{"VISUAL": "MEAN_STD", ...}`; a type it lacks is not normalized); `after` the
    preprocessor's steps behind its normalizer (pi0.5 writes the normalized state into its prompt
    there) and `unnormalized` the postprocessor's between its unnormalizer and the device step."""

    before: tuple[dict[str, Any], ...]
    features: dict[str, dict[str, Any]]
    norm_map: dict[str, str]
    after: tuple[dict[str, Any], ...] = ()
    unnormalized: tuple[dict[str, Any], ...] = ()

    def preprocessor(self, stats: dict[str, dict[str, torch.Tensor]]) -> ProcessorFiles:
        """(policy_preprocessor.json, one tensor dict per step) for our normalize step's statistics."""
        index = len(self.before)
        normalizer = self._normalizer(NORMALIZER, layout.PREPROCESSOR, index, self.features)
        steps = [*self.before, normalizer, *self.after]
        tensors = [*({} for _ in self.before), self._tensors(stats), *({} for _ in self.after)]
        return _pipeline(layout.PREPROCESSOR, steps), tensors

    def postprocessor(self, stats: dict[str, dict[str, torch.Tensor]]) -> ProcessorFiles:
        """(policy_postprocessor.json, one tensor dict per step): unnormalize the action, then the CPU."""
        outputs = {ACTION_KEY: self.features[ACTION_KEY]}
        unnormalizer = self._normalizer(UNNORMALIZER, layout.POSTPROCESSOR, 0, outputs)
        steps = [unnormalizer, *self.unnormalized, device()]
        tensors = [self._tensors(stats, outputs), *({} for _ in self.unnormalized), {}]
        return _pipeline(layout.POSTPROCESSOR, steps), tensors

    def _normalizer(
        self, registry_name: str, processor: str, index: int, features: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            **step(registry_name, eps=EPS, features=features, norm_map=dict(self.norm_map)),
            "state_file": layout.lerobot_state_file_name(processor, index, registry_name),
        }

    def _tensors(
        self, stats: dict[str, dict[str, torch.Tensor]], features: dict[str, dict[str, Any]] | None = None
    ) -> dict[str, torch.Tensor]:
        """Our per-key mean/std as the flat `<feature>.<stat>` float32 tensors LeRobot's normalizer
        loads, for every feature its mode normalizes (an IDENTITY one has none)."""
        out: dict[str, torch.Tensor] = {}
        for name, (mean, std) in self._feature_stats(stats, features or self.features).items():
            mode = self.norm_map.get(self.features[name]["type"], "IDENTITY")
            if mode == "MEAN_STD":
                out[f"{name}.mean"], out[f"{name}.std"] = mean, std
            elif mode in RANGES:
                low, high = RANGES[mode]
                out[f"{name}.{low}"], out[f"{name}.{high}"] = mean - std, mean + std
            elif bool((mean != 0).any() or (std != 1).any()):  # IDENTITY: LeRobot would not normalize it
                raise ConfigError(
                    f"{name} is normalized by these statistics, but its type {self.features[name]['type']} "
                    "is IDENTITY in LeRobot's pipeline for this policy: its processors cannot be written in "
                    "LeRobot's schema (a checkpoint of an older release normalized it: retrain to export)"
                )
        return {key: tensor.detach().to("cpu", torch.float32).contiguous() for key, tensor in out.items()}

    def _feature_stats(
        self, stats: dict[str, dict[str, torch.Tensor]], features: dict[str, dict[str, Any]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """(mean, std) of each of `features` from ours: LeRobot's STATE and ENV vectors are consecutive
        slices of our `observation.state` (the robot's first, as policies/act/lerobot.py reads them); a camera's
        are its (C, 1, 1) statistics."""
        out, offset = {}, 0
        for name, feature in self.features.items():
            if feature["type"] in _VECTOR_TYPES:
                width = int(feature["shape"][0])
                if name in features:
                    s = stats[OBS_KEY]
                    out[name] = (s["mean"][offset : offset + width], s["std"][offset : offset + width])
                offset += width
            elif name in features and name in stats:
                channels = int(feature["shape"][0]) if feature["type"] == "VISUAL" else -1
                shape = (channels, 1, 1) if feature["type"] == "VISUAL" else (-1,)
                out[name] = (stats[name]["mean"].reshape(shape), stats[name]["std"].reshape(shape))
        return out


def _pipeline(name: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "steps": steps}


# LeRobot's processor steps that hold normalization statistics; its other steps (rename, batch axis,
# the task's newline and tokenizer, device) are what the policy and the input pipeline do here.
_LEROBOT_NORMALIZERS = {"normalizer_processor": False, "unnormalizer_processor": True}


def from_lerobot(
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


def _merge_environment_state(
    names: list[str], stats: dict[str, torch.Tensor], features: dict[str, Any]
) -> list[str]:
    """LeRobot's separate `observation.environment_state` statistics appended to `observation.state`'s
    (our batch carries both in one vector, the robot's first, as policies/act/lerobot.py reads LeRobot's ACT);
    a feature left unnormalized (IDENTITY: LeRobot's ACT does not normalize ENV) gets mean 0, std 1."""
    parts: dict[str, list[torch.Tensor]] = {"mean": [], "std": []}
    for name in (OBS_KEY, ENV_KEY):
        width = int((features.get(name) or {"shape": [0]})["shape"][0])
        for stat, fill in (("mean", torch.zeros), ("std", torch.ones)):
            parts[stat].append(stats.pop(f"{name}.{stat}", fill(width)))
    stats[f"{OBS_KEY}.mean"], stats[f"{OBS_KEY}.std"] = torch.cat(parts["mean"]), torch.cat(parts["std"])
    return [OBS_KEY, *(n for n in names if n not in (OBS_KEY, ENV_KEY))]
