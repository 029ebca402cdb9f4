"""Pre/post-processors: normalization with dataset statistics, kept beside the weights.

The preprocessor maps raw observations (and, in training, target actions) to zero mean and unit
variance; the postprocessor maps the policy's actions back to torques. A camera
(`observation.images.*`, uint8 in the batch) is first scaled to [0, 1] floats, then normalized with its
per-channel (C, 1, 1) statistics. Their statistics are saved with
every checkpoint, so a policy loaded for evaluation sees inputs on the scale it was trained on.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.data.dataset import ACTION_KEY, OBS_KEY

CAMERA_PREFIX = "observation.images."
PREPROCESSOR_KEYS = (OBS_KEY, ACTION_KEY)
POSTPROCESSOR_KEYS = (ACTION_KEY,)


class Normalize:
    """One processor step: `(x - mean) / std` per feature (or its inverse)."""

    def __init__(
        self, stats: dict[str, dict[str, torch.Tensor]], keys: tuple[str, ...], inverse: bool
    ) -> None:
        self.stats = {key: stats[key] for key in keys}
        self.inverse = inverse

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        for key, s in self.stats.items():
            if key in out:
                value = out[key]
                if value.dtype == torch.uint8:  # a camera as decoded
                    value = value.float() / 255
                mean, std = s["mean"].to(value.device), s["std"].to(value.device)
                out[key] = value * std + mean if self.inverse else (value - mean) / std
        return out

    def config(self) -> dict[str, Any]:
        return {"type": "unnormalize" if self.inverse else "normalize", "features": sorted(self.stats)}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"{key}.{name}": t.contiguous() for key, s in self.stats.items() for name, t in s.items()}


class Processor:
    """An ordered list of steps; its state is (config, one tensor dict per step)."""

    def __init__(self, steps: list[Normalize]) -> None:
        self.steps = steps

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for step in self.steps:
            batch = step(batch)
        return batch

    def state(self) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        return {"steps": [step.config() for step in self.steps]}, [step.tensors() for step in self.steps]

    @classmethod
    def from_state(cls, config: dict[str, Any], step_tensors: list[dict[str, torch.Tensor]]) -> Processor:
        """The processor `state()` described (read back from a checkpoint)."""
        steps = []
        for step, tensors in zip(config.get("steps", []), step_tensors, strict=True):
            stats: dict[str, dict[str, torch.Tensor]] = {}
            for name, tensor in tensors.items():
                key, _, stat = name.rpartition(".")
                stats.setdefault(key, {})[stat] = tensor
            steps.append(Normalize(stats, tuple(step["features"]), inverse=step["type"] == "unnormalize"))
        return cls(steps)


def build_processors(stats: dict[str, dict[str, torch.Tensor]]) -> tuple[Processor, Processor]:
    """(preprocessor, postprocessor) for a dataset's statistics (cameras: those the stats hold)."""
    cameras = tuple(sorted(key for key in stats if key.startswith(CAMERA_PREFIX)))
    return (
        Processor([Normalize(stats, (*PREPROCESSOR_KEYS, *cameras), inverse=False)]),
        Processor([Normalize(stats, POSTPROCESSOR_KEYS, inverse=True)]),
    )
