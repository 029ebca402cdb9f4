"""Pre/post-processors: normalization with dataset statistics, kept beside the weights.

The preprocessor maps raw observations (and, in training, target actions) to zero mean and unit
variance; the postprocessor maps the policy's actions back to torques. A camera
(`observation.images.*`, uint8 in the batch) is first scaled to [0, 1] floats, then normalized with its
per-channel (C, 1, 1) statistics. Their statistics are saved with
every checkpoint, so a policy loaded for evaluation sees inputs on the scale it was trained on.

Beside it: the normalization modes' maths (normalization.py), LeRobot's processor files both ways
(lerobot_schema.py) and each robot's share of the statistics (robots.py)."""

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
from trainer.data.pipeline.lerobot_schema import from_lerobot
from trainer.data.pipeline.robots import EMBODIMENT_PREFIX, EMBODIMENTS, cut, kept, saved_embodiments, split
from trainer.errors import ConfigError

PREPROCESSOR_KEYS = (OBS_KEY, ACTION_KEY)
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
                key: {name: cut(key, t, embodiment) for name, t in s.items()}
                for key, s in step.sets[k].items()
                if kept(key, embodiment)
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
        embodiments = saved_embodiments(config)
        sets = [_read_steps(config, tensors, sizes) for tensors in split(step_tensors, len(embodiments))]
        steps = [
            Normalize(stats, features, inverse, [read[index][2] for read in sets[1:]])
            for index, (features, inverse, stats) in enumerate(sets[0])
        ]
        return cls(steps, embodiments=embodiments)


def _read_steps(
    config: Any, step_tensors: list[dict[str, torch.Tensor]], sizes: dict[str, int] | None
) -> list[tuple[tuple[str, ...], bool, dict[str, dict[str, torch.Tensor]]]]:
    """(features, inverse, statistics) of each saved normalize step: ours, or LeRobot's normalizer
    and unnormalizer (`lerobot_schema.from_lerobot`), checked as `Processor.from_state` says."""
    steps_config = config.get("steps") if isinstance(config, dict) else None
    if isinstance(steps_config, list) and any(
        isinstance(s, dict) and "registry_name" in s for s in steps_config
    ):
        config, step_tensors = from_lerobot(steps_config, step_tensors)
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
