"""A policy that reads cameras, as a camera policy (ACT with a vision backbone) does through the batch
contract: `observation.images.<name>` arrives normalized by the preprocessor, (B, C, H, W) float.

Its prediction is linear in the state and in each camera's per-channel mean, so its weights after a run
depend on every camera frame it was trained on, in order: equal weights mean equal frames.
Use it with `--policy.type=helpers.camera_policy:CameraPolicyConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config.policy import PolicyConfig
from trainer.policies.common.base import Policy

CAMERAS = 2  # the LeRobot fixtures' top and wrist


@dataclass
class CameraPolicyConfig(PolicyConfig):
    """Linear in the state and the cameras' channel means."""

    input_features: list[str] = field(default_factory=lambda: ["observation.images.*"])

    def policy_class(self) -> type[Policy]:
        return CameraPolicy


class CameraPolicy(Policy):
    def __init__(self, config: CameraPolicyConfig) -> None:
        super().__init__(config)
        self.head = nn.Linear(config.obs_dim + 3 * CAMERAS, config.action_dim)

    def _features(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        cameras = sorted(key for key in batch if key.startswith("observation.images."))
        assert len(cameras) == CAMERAS and all(batch[k].dtype == torch.float32 for k in cameras)
        means = [batch[key].mean(dim=(2, 3)) for key in cameras]
        return torch.cat([batch["observation.state"], *means], dim=1)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return F.mse_loss(self.head(self._features(batch)), batch["action"][:, 0]), {}

    @torch.no_grad()
    def select_action(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("trained in tests only")
