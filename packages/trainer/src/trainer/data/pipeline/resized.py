"""Frames brought to a policy's input size in the data, for a mixture whose members record one camera at
different sizes (data/sources/mixture.py).

A policy that resizes every frame to its own input size anyway (SmolVLA, pi0/pi0.5:
`PolicyConfig.frame_resize`) reads such a mixture as it reads one robot: each member's frames of that
camera go through the policy's own resize here, as [0, 1] floats (`frames_as_float`), so the batch holds
one size per camera and the policy's resize is then the identity on them. The policy only offers its
resize where doing it before the preprocessor equals doing it after (cameras normalized IDENTITY), so
the frames it reads are the ones it would have made itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.config.dataset import Dataset, FrameResize, Frames
from trainer.data.dataset import frames_as_float
from trainer.data.pipeline.view import DatasetView


def resized_shape(resize: FrameResize, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """(C, H, W) of a `shape` frame after `resize`."""
    channels, height, width = resize(torch.zeros(1, *shape)).shape[1:]
    return int(channels), int(height), int(width)


class ResizedFrames(DatasetView):
    """`inner` with the frames of `cameras` passed through `resize` (float, any leading axes)."""

    def __init__(self, inner: Dataset, cameras: Sequence[str], resize: FrameResize) -> None:
        super().__init__(inner)
        self.cameras, self.resize = list(cameras), resize

    def gather(self, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        batch = self.inner.gather(indices, frames)
        for name in self.cameras:
            frames_of = frames_as_float(batch[name])
            flat = self.resize(frames_of.reshape(-1, *frames_of.shape[-3:]))
            batch[name] = flat.reshape(*frames_of.shape[:-3], *flat.shape[1:])
        return batch
