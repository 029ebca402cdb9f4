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

from trainer.config.dataset import Embodiment
from trainer.config.policy import ProcessorSchema
from trainer.data.dataset import (
    ACTION_KEY,
    EMBODIMENT_KEY,
    OBS_KEY,
    TASK_KEY,
    frames_as_float,
    is_camera,
    task_bytes,
)
from trainer.data.pipeline.lerobot_schema import RANGES
from trainer.errors import ConfigError

PREPROCESSOR_KEYS = (OBS_KEY, ACTION_KEY)
ENV_KEY = "observation.environment_state"  # LeRobot's environment state, a separate vector there
POSTPROCESSOR_KEYS = (ACTION_KEY,)


class Normalize:
    """One processor step: `(x - mean) / std` per feature (or its inverse).

    With several embodiments (a mixture of robots that differ: data/pipeline/embodiments.py) it holds
    one set of statistics per embodiment, `sets[k]` for embodiment k, and normalizes each item of a
    batch by the set its `embodiment` index names; a batch without that key, by the first set (the
    default embodiment's)."""

    def __init__(
        self,
        stats: dict[str, dict[str, torch.Tensor]],
        keys: Sequence[str],
        inverse: bool,
        others: Sequence[dict[str, dict[str, torch.Tensor]]] = (),
    ) -> None:
        # mean and std alone: what the step applies and saves (a dataset's min/max reach a MIN_MAX
        # policy's processors as mean/std through `PolicyConfig.normalization_stats`)
        self.sets = [
            {key: {name: s[key][name] for name in ("mean", "std")} for key in keys} for s in (stats, *others)
        ]
        self.inverse = inverse

    @property
    def stats(self) -> dict[str, dict[str, torch.Tensor]]:
        """The statistics of the default embodiment (the only ones without embodiments)."""
        return self.sets[0]

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        index = batch.get(EMBODIMENT_KEY) if len(self.sets) > 1 else None
        for key in self.stats:
            if key in out:
                value = frames_as_float(out[key])  # a camera arrives as decoded (uint8)
                mean, std = self._statistics(key, value, index)
                out[key] = value * std + mean if self.inverse else (value - mean) / std
        return out

    def _statistics(
        self, key: str, value: torch.Tensor, index: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`key`'s mean and std for `value`: the default's, or each item's embodiment's, shaped
        (B, 1.., *stat) to broadcast over a frame axis."""
        if index is None:
            return self.stats[key]["mean"].to(value.device), self.stats[key]["std"].to(value.device)
        picked = []
        for name in ("mean", "std"):
            stacked = torch.stack([s[key][name] for s in self.sets]).to(value.device)[index.to(value.device)]
            picked.append(stacked.view(len(index), *[1] * (value.ndim - stacked.ndim), *stacked.shape[1:]))
        return picked[0], picked[1]

    def config(self) -> dict[str, Any]:
        return {"type": "unnormalize" if self.inverse else "normalize", "features": sorted(self.stats)}

    def tensors(self, embodiment: int = 0) -> dict[str, torch.Tensor]:
        stats = self.sets[embodiment]
        return {f"{key}.{name}": t.contiguous() for key, s in stats.items() for name, t in s.items()}


class Processor:
    """An ordered list of steps; its state is (config, one tensor dict per step): in LeRobot 0.6.1's
    pipeline schema when the policy has a LeRobot counterpart (`lerobot`, one normalize step), else
    ours (`{"steps": [{"type": "normalize", "features": [...]}]}`, docs/format.md).

    With `embodiments` (one per set of its steps' statistics) the state holds every embodiment: the
    default's (the first) as above, so LeRobot reads it, each other one's in the same step file under
    `embodiment.<k>.<feature>.<stat>` (which LeRobot's normalizer loads and never applies), and the
    config lists them under `embodiments` (`Embodiment.to_json`; LeRobot ignores the key)."""

    def __init__(
        self,
        steps: list[Normalize],
        lerobot: ProcessorSchema | None = None,
        embodiments: Sequence[Embodiment] = (),
    ) -> None:
        self.steps = steps
        self.lerobot = lerobot
        self.embodiments = list(embodiments)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for step in self.steps:
            batch = step(batch)
        return batch

    def state(self) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        config, tensors = self._state(0)
        for k in range(1, len(self.embodiments)):
            for own, more in zip(tensors, self._state(k)[1], strict=True):
                own.update({f"{EMBODIMENT_PREFIX}{k}.{name}": tensor for name, tensor in more.items()})
        if self.embodiments:
            config = {**config, EMBODIMENTS: [e.to_json() for e in self.embodiments]}
        return config, tensors

    def _state(self, embodiment: int) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        """The state of one embodiment's statistics (of the only ones without embodiments)."""
        if self.lerobot is not None:
            (step,) = self.steps
            write = self.lerobot.postprocessor if step.inverse else self.lerobot.preprocessor
            return write(step.sets[embodiment])
        config = {"steps": [step.config() for step in self.steps]}
        return config, [step.tensors(embodiment) for step in self.steps]

    def for_embodiment(self, embodiment: Embodiment) -> Processor:
        """This processor for one of its embodiments alone: that one's statistics cut to its own state
        and action sizes and features (what `load_policy(embodiment=)` applies and an export holds)."""
        k = self.embodiments.index(embodiment)
        steps = []
        for step in self.steps:
            stats = {
                key: {name: _cut(key, t, embodiment) for name, t in s.items()}
                for key, s in step.sets[k].items()
                if _kept(key, embodiment)
            }
            steps.append(Normalize(stats, list(stats), step.inverse))
        return Processor(steps, self.lerobot)

    @classmethod
    def from_state(
        cls, config: Any, step_tensors: list[dict[str, torch.Tensor]], sizes: dict[str, int] | None = None
    ) -> Processor:
        """The processor `state()` described (read back from a checkpoint, so checked first: the
        config's steps against the step files, each feature's `mean` and `std` present, 1-D, of the
        size `sizes` gives for it, the embodiments' list against their statistics). Raises
        `ConfigError` naming the first problem."""
        embodiments = _embodiments(config)
        sets = [_read_steps(config, tensors, sizes) for tensors in _split(step_tensors, len(embodiments))]
        steps = [
            Normalize(stats, features, inverse, [read[index][2] for read in sets[1:]])
            for index, (features, inverse, stats) in enumerate(sets[0])
        ]
        return cls(steps, embodiments=embodiments)


EMBODIMENTS = "embodiments"  # the processor config's list of embodiments
EMBODIMENT_PREFIX = "embodiment."  # `embodiment.<k>.`: embodiment k's statistics in a step file


def _embodiments(config: Any) -> list[Embodiment]:
    """The embodiments a saved processor config lists ([] when it has none), each entry checked."""
    listed = config.get(EMBODIMENTS) if isinstance(config, dict) else None
    if listed is None:
        return []
    if not isinstance(listed, list) or not listed:
        raise ConfigError(f"its processor config's {EMBODIMENTS} is not a list of embodiments")
    found = []
    for index, entry in enumerate(listed):
        features = entry.get("input_features") if isinstance(entry, dict) else None
        sizes = [entry.get(n) for n in ("obs_dim", "action_dim")] if isinstance(entry, dict) else []
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes)
            and isinstance(features, list)
            and all(isinstance(f, str) for f in features)
        ):
            raise ConfigError(
                f"its processor config's embodiment {index} is not {{name, obs_dim, action_dim, input_features}}"
            )
        found.append(
            Embodiment(entry["name"], int(entry["obs_dim"]), int(entry["action_dim"]), tuple(features))
        )
    names = [e.name for e in found]
    if len(set(names)) != len(names):
        raise ConfigError(f"its processor config names an embodiment twice: {', '.join(names)}")
    return found


def embodiment_tensors(
    config: Any, step_tensors: list[dict[str, torch.Tensor]], embodiment: Embodiment
) -> list[dict[str, torch.Tensor]]:
    """One embodiment's step tensors of a saved processor, under their own names and as saved (what
    LeRobot's normalizer reads, unchanged), cut to its sizes and features: an export's state files."""
    embodiments = _embodiments(config)
    own = _split(step_tensors, len(embodiments))[embodiments.index(embodiment)]
    return [
        {
            name: _cut(name.rpartition(".")[0], t, embodiment)
            for name, t in tensors.items()
            if _kept(name.rpartition(".")[0], embodiment)
        }
        for tensors in own
    ]


def _kept(key: str, embodiment: Embodiment) -> bool:
    """Whether an embodiment has the feature `key` normalizes (the state and action always)."""
    return key in (OBS_KEY, ACTION_KEY) or key in embodiment.input_features


def _cut(key: str, tensor: torch.Tensor, embodiment: Embodiment) -> torch.Tensor:
    """A statistic of `key` cut to an embodiment's own size along its last axis (the state's and the
    action's; the others as they are)."""
    sizes = {OBS_KEY: embodiment.obs_dim, ACTION_KEY: embodiment.action_dim}
    return tensor[..., : sizes[key]] if key in sizes else tensor


def _split(step_tensors: list[dict[str, torch.Tensor]], count: int) -> list[list[dict[str, torch.Tensor]]]:
    """Each embodiment's step tensors (the default's under their own names, embodiment k's under
    `embodiment.<k>.`; all of them for one set without embodiments)."""
    sets: list[list[dict[str, torch.Tensor]]] = [[{} for _ in step_tensors] for _ in range(max(count, 1))]
    for index, tensors in enumerate(step_tensors):
        for name, tensor in tensors.items():
            k, own = 0, name
            if count and name.startswith(EMBODIMENT_PREFIX):
                number, _, own = name.removeprefix(EMBODIMENT_PREFIX).partition(".")
                k = int(number) if number.isdigit() else -1
                if not 0 < k < count:
                    raise ConfigError(
                        f"its processor step {index} holds {name}, but the config lists {count} embodiments"
                    )
            sets[k][index][own] = tensor
    return sets


def _read_steps(
    config: Any, step_tensors: list[dict[str, torch.Tensor]], sizes: dict[str, int] | None
) -> list[tuple[tuple[str, ...], bool, dict[str, dict[str, torch.Tensor]]]]:
    """(features, inverse, statistics) of each saved normalize step: ours, or LeRobot's normalizer
    and unnormalizer (`_from_lerobot`), checked as `Processor.from_state` says."""
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
        steps.append((features, inverse, stats))
    return steps


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
    (our batch carries both in one vector, the robot's first, as policies/act/lerobot.py reads LeRobot's ACT);
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
    return embodied_processors([stats], lerobot)


def embodied_processors(
    stats: Sequence[dict[str, dict[str, torch.Tensor]]],
    lerobot: ProcessorSchema | None = None,
    embodiments: Sequence[Embodiment] = (),
) -> tuple[Processor, Processor]:
    """(preprocessor, postprocessor) for each embodiment's statistics (`stats[k]` for `embodiments[k]`,
    all of the same keys and sizes), each item normalized by its own (`Normalize`)."""
    first, others = stats[0], stats[1:]
    cameras = tuple(sorted(key for key in first if is_camera(key)))
    return (
        Processor([Normalize(first, PREPROCESSOR_KEYS + cameras, False, others)], lerobot, embodiments),
        Processor([Normalize(first, POSTPROCESSOR_KEYS, True, others)], lerobot, embodiments),
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
