"""ResNet trunks for the policies' cameras, in plain torch (torchvision is not a dependency).

The modules carry torchvision's names (`conv1`, `bn1`, `layer1`..`layer4`, `downsample.0/1`), so the
weights torchvision and timm publish for ResNet-18/34 load as they are. ACT's batch norm is frozen (its
running statistics and affine terms are buffers, as torchvision's `FrozenBatchNorm2d`, which LeRobot's
ACT uses): small robot batches would otherwise wreck the statistics of a pretrained trunk. The trunk
returns the `layer4` feature map, as LeRobot's `IntermediateLayerGetter(return_layers={"layer4": ...})`.
Diffusion Policy picks the norm layer (`norm`: trained batch norm, or group norm) and reads the trunk as
torchvision's `children()[:-2]` (`as_sequential`), the names its checkpoints use.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trainer.errors import ConfigError

FLAG = "--policy.pretrained_backbone_weights"
BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}
FEATURE_CHANNELS = 512  # layer4's width for the BasicBlock ResNets
# LeRobot's default names torchvision's weight enum; the same weights are on the Hub in timm's
# safetensors (identical key names), which is how they are read here (through the HF cache).
TORCHVISION_WEIGHTS = {
    "ResNet18_Weights.IMAGENET1K_V1": "timm/resnet18.tv_in1k",
    "ResNet34_Weights.IMAGENET1K_V1": "timm/resnet34.tv_in1k",
}
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_STEP_COUNTER = "num_batches_tracked"  # a trained batch norm's counter: no weight file needs to hold it
Norm = Callable[[int], nn.Module]  # a norm layer for this many channels


_IDENTITY = {"weight": 1.0, "bias": 0.0, "running_mean": 0.0, "running_var": 1.0}


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine terms (buffers, never trained)."""

    weight: torch.Tensor
    bias: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        for name in _IDENTITY:
            self.register_buffer(name, torch.empty(channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The identity transform (a meta build recomputes it here; pretrained statistics replace it)."""
        for name, value in _IDENTITY.items():
            getattr(self, name).fill_(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (a 1x1 `downsample` when the shape changes)."""

    def __init__(
        self, inp: int, out: int, stride: int, dilation: int, norm: Norm = FrozenBatchNorm2d
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = norm(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = norm(out)
        self.downsample = (
            nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), norm(out))
            if stride != 1 or inp != out
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNetStage(nn.Sequential):
    """One of `layer1`..`layer4`: a class of its own so that it can be an FSDP wrap unit."""


class ResNetTrunk(nn.Module):
    """conv1 / bn1 / max-pool / layer1..layer4 of a BasicBlock ResNet, returning layer4's features.

    `dilate_last` replaces layer4's stride with dilation 2 (LeRobot's
    `replace_final_stride_with_dilation`): a feature map twice as large per side, the same weights.
    torchvision refuses this for BasicBlock; here layer4's first block keeps dilation 1 and the
    following ones dilate, as torchvision's `_make_layer` does for the blocks that support it.
    `norm` builds every norm layer (frozen batch norm by default, ACT's)."""

    def __init__(self, name: str, dilate_last: bool = False, norm: Norm = FrozenBatchNorm2d) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, padding=3, bias=False)
        self.bn1 = norm(64)
        widths, inp = (64, 128, 256, 512), 64
        for index, (width, count) in enumerate(zip(widths, BLOCKS[name], strict=True)):
            last = index == 3 and dilate_last
            stride = 1 if index == 0 or last else 2
            blocks = []
            for i in range(count):
                dilation = 2 if last and i > 0 else 1
                blocks.append(BasicBlock(inp, width, stride if i == 0 else 1, dilation, norm))
                inp = width
            self.add_module(f"layer{index + 1}", ResNetStage(*blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, padding=1)
        for index in range(1, 5):
            x = getattr(self, f"layer{index}")(x)
        return x


def as_sequential(trunk: ResNetTrunk) -> nn.Sequential:
    """The trunk's modules in torchvision's `children()[:-2]` order (conv1, bn1, relu, max-pool,
    layer1..layer4: indices 0..7), which is how LeRobot's Diffusion Policy holds and names its trunk."""
    layers = [getattr(trunk, f"layer{index}") for index in range(1, 5)]
    return nn.Sequential(trunk.conv1, trunk.bn1, nn.ReLU(), nn.MaxPool2d(3, 2, padding=1), *layers)


def load_pretrained(trunk: ResNetTrunk, source: str) -> None:
    """Copy torchvision/timm-named weights into `trunk` from `source`: a local safetensors file, a Hub
    model repo id (its `model.safetensors`, through the HF cache), or one of torchvision's weight enum
    names (`ResNet18_Weights.IMAGENET1K_V1`, read as its timm copy on the Hub). The classifier (`fc.*`)
    and batch-norm step counters are ignored (a trained batch norm keeps its own); any other trunk tensor
    missing or of another shape is an error naming the flag."""
    from safetensors.torch import load_file

    path = _weights_file(source)
    try:
        state = load_file(path)
    except Exception as exc:  # a truncated or foreign file: safetensors raises several types
        raise ConfigError(f"{FLAG}={source}: {path} is not a readable safetensors file ({exc})") from None
    own = {name: t for name, t in trunk.state_dict().items() if not name.endswith(_STEP_COUNTER)}
    missing = [name for name in own if name not in state]
    if missing:
        raise ConfigError(
            f"{FLAG}={source}: the weights lack {missing[0]!r} ({len(missing)} of the trunk's {len(own)} "
            "tensors missing): give a torchvision- or timm-named ResNet of the --policy.vision_backbone"
        )
    wrong = [name for name, tensor in own.items() if state[name].shape != tensor.shape]
    if wrong:
        raise ConfigError(
            f"{FLAG}={source}: {wrong[0]!r} is {tuple(state[wrong[0]].shape)}, the trunk's is "
            f"{tuple(own[wrong[0]].shape)}: the file holds another architecture than --policy.vision_backbone"
        )
    trunk.load_state_dict({name: state[name] for name in own}, strict=False)  # the counters stay


def _weights_file(source: str) -> str:
    if os.path.isfile(source):
        return source
    repo = TORCHVISION_WEIGHTS.get(source, source)
    if not _REPO_ID.match(repo) or source.endswith(".safetensors"):
        raise ConfigError(
            f"{FLAG}={source}: no such file, and not a Hub repo id: give a local safetensors file, a repo id, "
            f"or null to train the backbone from scratch"
        )
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo, "model.safetensors")
    except Exception as exc:  # offline and not cached, unknown repo, no access: the same way out
        raise ConfigError(
            f"{FLAG}={source}: cannot read {repo}'s model.safetensors from the Hub or its cache "
            f"({type(exc).__name__}); download it first, give a local file, or pass null to train from scratch"
        ) from None
