"""Camera frames and vectors as LeRobot's VLA policies feed them: resized with their aspect kept and
zero-padded, vectors zero-padded to the model's width."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resize_with_pad(image: torch.Tensor, height: int, width: int, centred: bool = False) -> torch.Tensor:
    """(B, C, h, w) in [0, 1] resized to fit (height, width) with its aspect kept (bilinear, sizes
    truncated to integers), zero-padded on the left and top (SmolVLA), or `centred` with the odd row or
    column at the bottom / right and the resized frame clamped to [0, 1] first (openpi's pi0)."""
    h, w = image.shape[2:]
    if (h, w) == (height, width):
        return image
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = F.interpolate(image, size=(new_h, new_w), mode="bilinear", align_corners=False)
    pad_h, pad_w = max(0, height - new_h), max(0, width - new_w)
    if not centred:
        return F.pad(resized, (pad_w, 0, pad_h, 0), value=0.0)
    top, left = pad_h // 2, pad_w // 2
    return F.pad(resized.clamp(0.0, 1.0), (left, pad_w - left, top, pad_h - top), value=0.0)


def pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """`x` zero-padded on its last dimension to `size` (unchanged when it is as wide or wider)."""
    return x if x.shape[-1] >= size else F.pad(x, (0, size - x.shape[-1]))
