"""Camera augmentation (`--dataset.image_transforms.*`, LeRobot's names and defaults), with kornia on
whole batches on the device.

As LeRobot's `RandomSubsetApply`, each sample gets a random subset of at most `max_num_transforms` of
the configured transforms, drawn by `weight`, applied in the order of their names (LeRobot: the listed
order; a saved config's dict comes back with sorted keys) or, with `random_order`, in an order drawn
once per batch. LeRobot draws in each DataLoader worker from the worker's RNG, so a resumed run
cannot repeat its draws; here every draw comes from a generator seeded by (run seed, loop step, rank),
so step `s` of a resumed run is augmented exactly as step `s` of the uninterrupted one, whatever the
number of workers. The global RNG is left untouched (dropout keeps its own stream).

kornia is the `augment` extra, imported only when augmentation is enabled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.data.dataset import camera_frames, frames_as_float
from trainer.errors import ConfigError

TRANSFORM_TYPES = ("ColorJitter", "SharpnessJitter", "RandomAffine", "Identity")

Batch = dict[str, torch.Tensor]


@dataclass
class ImageTransformConfig:
    """One transform: its kind, its kwargs (ranges, as LeRobot gives them) and how often it is drawn."""

    weight: float = 1.0
    """Relative chance of being among a sample's transforms (0 never draws it)."""
    type: str = "Identity"
    """ColorJitter, SharpnessJitter, RandomAffine or Identity."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The transform's arguments, e.g. {"brightness": [0.8, 1.2]}."""


def _default_transforms() -> dict[str, ImageTransformConfig]:
    def jitter(name: str, low: float, high: float) -> ImageTransformConfig:
        return ImageTransformConfig(type="ColorJitter", kwargs={name: (low, high)})

    return {
        "brightness": jitter("brightness", 0.8, 1.2),
        "contrast": jitter("contrast", 0.8, 1.2),
        "saturation": jitter("saturation", 0.5, 1.5),
        "hue": jitter("hue", -0.05, 0.05),
        "sharpness": ImageTransformConfig(type="SharpnessJitter", kwargs={"sharpness": (0.5, 1.5)}),
        "affine": ImageTransformConfig(
            type="RandomAffine", kwargs={"degrees": (-5.0, 5.0), "translate": (0.05, 0.05)}
        ),
    }


@dataclass
class ImageTransformsConfig:
    """Training-time camera augmentation (LeRobot's `ImageTransformsConfig`)."""

    enable: bool = False
    """Augment the cameras of every training batch (needs the `augment` extra: kornia)."""
    max_num_transforms: int = 3
    """At most this many transforms per sample."""
    random_order: bool = False
    """Apply a sample's transforms in an order drawn per batch instead of the listed order."""
    tfs: dict[str, ImageTransformConfig] = field(default_factory=_default_transforms)
    """The transforms by name (LeRobot's defaults: brightness, contrast, saturation, hue, sharpness, affine)."""

    def __post_init__(self) -> None:
        for name, tf in self.tfs.items():
            if tf.type not in TRANSFORM_TYPES:
                raise ConfigError(
                    f"--dataset.image_transforms.tfs.{name}.type={tf.type!r} is not one of {', '.join(TRANSFORM_TYPES)}"
                )
            if tf.weight < 0:
                raise ConfigError(
                    f"--dataset.image_transforms.tfs.{name}.weight must be >= 0, got {tf.weight}"
                )
        if self.max_num_transforms < 1:
            raise ConfigError(
                f"--dataset.image_transforms.max_num_transforms must be >= 1, got {self.max_num_transforms}"
            )


class Augment:
    """`augment(batch, step)`: the batch with its cameras as float [0, 1], augmented for loop `step`."""

    def __init__(self, config: ImageTransformsConfig, seed: int, rank: int) -> None:
        kornia = _import_kornia()
        # by name: train_config.json stores the dict with sorted keys, and a resumed run must draw alike
        chosen = {name: config.tfs[name] for name in sorted(config.tfs) if config.tfs[name].weight > 0}
        self.names = list(chosen)
        self.weights = torch.tensor([tf.weight for tf in chosen.values()], dtype=torch.float64)
        self.transforms = [_kornia_transform(kornia, tf) for tf in chosen.values()]
        self.count = min(config.max_num_transforms, len(self.names))
        self.random_order = config.random_order
        self.seed, self.rank = seed, rank

    def __call__(self, batch: Batch, step: int) -> Batch:
        cameras = camera_frames(batch)
        if not cameras or not self.names:
            return batch
        out = dict(batch)
        size = len(batch[cameras[0]])
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 1_009 + self.rank)
        chosen = torch.stack(  # (samples, transforms): which transforms each sample gets
            [self._subset(generator) for _ in range(size)]
        )
        order = (
            torch.randperm(len(self.names), generator=generator)
            if self.random_order
            else range(len(self.names))
        )
        devices = [batch[cameras[0]].device] if batch[cameras[0]].is_cuda else []
        with torch.random.fork_rng(
            devices=devices
        ):  # kornia samples from the global RNG: seed it, then restore
            torch.manual_seed(int(torch.randint(2**62, (), generator=generator)))
            for key in cameras:
                image = frames_as_float(batch[key])
                for t in order:
                    mask = chosen[:, t].to(image.device)[:, None, None, None]
                    image = torch.where(mask, self.transforms[int(t)](image), image)
                out[key] = image
        return out

    def _subset(self, generator: torch.Generator) -> torch.Tensor:
        picked = torch.multinomial(self.weights, self.count, replacement=False, generator=generator)
        mask = torch.zeros(len(self.names), dtype=torch.bool)
        mask[picked] = True
        return mask


def _kornia_transform(kornia: Any, tf: ImageTransformConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    aug = kornia.augmentation
    kwargs = {key: tuple(value) if isinstance(value, list) else value for key, value in tf.kwargs.items()}
    if tf.type == "ColorJitter":
        return aug.ColorJitter(**kwargs, p=1.0)
    if tf.type == "SharpnessJitter":
        return aug.RandomSharpness(**kwargs, p=1.0)
    if tf.type == "RandomAffine":
        return aug.RandomAffine(**kwargs, p=1.0)
    return lambda image: image


def _import_kornia() -> Any:
    try:
        import kornia
    except ImportError:
        raise ConfigError(
            "--dataset.image_transforms.enable=true needs kornia: pip install 'ckpt-trainer[augment]'"
        ) from None
    return kornia
