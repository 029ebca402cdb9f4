"""A camera's frames to a feature vector, as LeRobot's `DiffusionRgbEncoder` computes it.

Resize (torchvision's `Resize` on tensors: antialiased bilinear), crop (random in training, the centre
in evaluation), the ResNet trunk held as torchvision's `children()[:-2]` (so its tensors are named
`backbone.0`, `backbone.4.0.conv1`, ... as in LeRobot's checkpoints), SpatialSoftmax keypoints and a
ReLU projection. The random crop draws from torch's global generator exactly as torchvision's
`RandomCrop` does (top, then left, one offset for the whole call), so a seeded run crops where LeRobot's
does.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainer.policies.common import resnet
from trainer.policies.diffusion.config import DiffusionConfig

TRUNK_HALVINGS = 5  # conv1, the max-pool and layer2..layer4 each map a side n to ceil(n / 2)


def norm_layer(use_group_norm: bool) -> resnet.Norm:
    """LeRobot's trunk norm: torchvision's trained batch norm, or (`_replace_submodules`) a GroupNorm of
    channels // 16 groups in its place, under the same name."""
    if use_group_norm:
        return lambda channels: nn.GroupNorm(channels // 16, channels)
    return nn.BatchNorm2d


def feature_map_side(side: int) -> int:
    """The trunk's output size along one side of a `side`-pixel input (LeRobot finds it by a dry run)."""
    for _ in range(TRUNK_HALVINGS):
        side = (side + 1) // 2
    return side


class SpatialSoftmax(nn.Module):
    """Keypoints of a feature map: a 1x1 convolution to K maps, a softmax over each map's positions,
    and the expected (x, y) under `pos_grid` ([-1, 1] per side, x varying fastest)."""

    pos_grid: torch.Tensor

    def __init__(self, channels: int, height: int, width: int, keypoints: int) -> None:
        super().__init__()
        self.height, self.width, self.keypoints = height, width, keypoints
        self.nets = nn.Conv2d(channels, keypoints, kernel_size=1)
        self.register_buffer("pos_grid", torch.empty(height * width, 2))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The grid, from numpy's linspace as LeRobot builds it (torch's differs in the last bit)."""
        x, y = np.meshgrid(np.linspace(-1.0, 1.0, self.width), np.linspace(-1.0, 1.0, self.height))
        grid = np.stack([x.reshape(-1), y.reshape(-1)], axis=1)
        self.pos_grid.copy_(torch.from_numpy(grid).float())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) feature maps -> (N, K, 2) keypoints."""
        attention = F.softmax(self.nets(features).reshape(-1, self.height * self.width), dim=-1)
        return (attention @ self.pos_grid).view(-1, self.keypoints, 2)


class RgbEncoder(nn.Module):
    """(N, C, H, W) normalized frames -> (N, 2K) features."""

    def __init__(self, config: DiffusionConfig, frame: tuple[int, int, int]) -> None:
        super().__init__()
        self.resize_shape = config.resize_shape
        self.crop_shape = config.crop_shape
        self.crop_is_random = config.crop_is_random
        self.vision_backbone = config.vision_backbone
        self.backbone = resnet.as_sequential(
            resnet.ResNetTrunk(config.vision_backbone, norm=norm_layer(config.use_group_norm))
        )
        height, width = config.backbone_input_shape(frame[1:])
        self.pool = SpatialSoftmax(
            resnet.FEATURE_CHANNELS,
            feature_map_side(height),
            feature_map_side(width),
            config.spatial_softmax_num_keypoints,
        )
        self.feature_dim = 2 * config.spatial_softmax_num_keypoints
        self.out = nn.Linear(self.feature_dim, self.feature_dim)

    def prepare(self, frames: torch.Tensor) -> torch.Tensor:
        """The trunk's input: resized, then cropped (random in training when crop_is_random)."""
        if self.resize_shape is not None and tuple(frames.shape[-2:]) != self.resize_shape:
            frames = F.interpolate(
                frames, size=self.resize_shape, mode="bilinear", align_corners=False, antialias=True
            )
        if self.crop_shape is None:
            return frames
        top, left = (
            random_crop_offsets(frames.shape[-2:], self.crop_shape)
            if self.training and self.crop_is_random
            else center_crop_offsets(frames.shape[-2:], self.crop_shape)
        )
        return frames[..., top : top + self.crop_shape[0], left : left + self.crop_shape[1]]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        keypoints = self.pool(self.backbone(self.prepare(frames)))
        return F.relu(self.out(keypoints.flatten(1)))

    def load_pretrained_backbone(self, source: str) -> None:
        """Torchvision- or timm-named ResNet weights (`resnet.load_pretrained`) into the trunk (a batch-norm
        one: the config refuses pretrained weights with group norm)."""
        trunk = resnet.ResNetTrunk(self.vision_backbone, norm=nn.BatchNorm2d)
        resnet.load_pretrained(trunk, source)
        self.backbone.load_state_dict(resnet.as_sequential(trunk).state_dict())


def center_crop_offsets(size: torch.Size, crop: tuple[int, int]) -> tuple[int, int]:
    """torchvision's `CenterCrop`: `round((n - c) / 2)` per side, Python's half-to-even rounding (2.5 -> 2)."""
    return round((size[0] - crop[0]) / 2.0), round((size[1] - crop[1]) / 2.0)


def random_crop_offsets(size: torch.Size, crop: tuple[int, int]) -> tuple[int, int]:
    """torchvision's `RandomCrop.get_params`: nothing drawn when the frame is the crop's size, else the
    top then the left offset, each one `torch.randint` of shape (1,) from the global generator."""
    if tuple(size) == tuple(crop):
        return 0, 0
    top = int(torch.randint(0, size[0] - crop[0] + 1, size=(1,)).item())
    left = int(torch.randint(0, size[1] - crop[1] + 1, size=(1,)).item())
    return top, left
