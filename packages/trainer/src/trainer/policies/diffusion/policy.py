"""DiffusionPolicy: LeRobot's Diffusion Policy behind this engine's `Policy` interface.

It holds the model as `diffusion`, so its tensors are LeRobot's names (`diffusion.rgb_encoder.*`,
`diffusion.unet.*`): LeRobot's `model.safetensors` loads with no renaming, and ours is LeRobot's.

A training batch holds what the config's `observation_delta_indices` / `action_delta_indices` ask the
data for: `observation.state` (B, n_obs_steps, D), each camera (B, n_obs_steps, C, H, W), `action`
(B, horizon, A) and `action_is_pad`, all normalized by the preprocessor; with `env_state_dim`, the last
values of `observation.state` are LeRobot's `observation.environment_state`, split off for the model. `select_action` takes one
observation step ((B, D), (B, C, H, W)) and keeps the history and the chunk's actions in the queues
(queues.py); `reset()` starts a new episode.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from trainer.data.dataset import ENV_KEY, OBS_KEY
from trainer.policies.common.base import Policy
from trainer.policies.diffusion.config import DiffusionConfig
from trainer.policies.diffusion.model import DiffusionModel
from trainer.policies.diffusion.queues import ActionQueue


class DiffusionPolicy(Policy):
    """LeRobot's `DiffusionPolicy`: the model under `diffusion`, the rollout queues beside it."""

    # FSDP units are modules whose forward() runs: every residual block of the U-Net (called by the
    # U-Net's forward, or through activation checkpointing) and each ResNet stage of a camera trunk.
    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ("ResidualBlock1d", "ResNetStage")
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action", "predict_action_chunk")

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__(config)
        self.config: DiffusionConfig = config
        self.diffusion = DiffusionModel(config, config.features())
        self._queues = ActionQueue(self.diffusion)

    def peft_target_modules(self) -> tuple[str, ...]:
        """LoRA on the FiLM projections of every residual block (LeRobot names no default targets
        for Diffusion Policy; these are the Linears that condition the U-Net on the observations)."""
        return ("cond_encoder.1",)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """LeRobot's denoising loss (its `forward` reports no other metric)."""
        loss = self.diffusion.compute_loss(self._cast(batch))
        return loss, {}

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The (B, n_action_steps, A) normalized actions for a batch with the observation history
        (B, n_obs_steps, ...), without the queues."""
        return self.diffusion.sample_actions(self._cast(batch), noise)

    @torch.no_grad()
    def select_action(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The (B, A) normalized action for one observation step; the model samples a chunk every
        `n_action_steps` calls (`noise`: that chunk's initial sample, drawn when None)."""
        return self._queues.select_action(self._cast(batch), noise)

    def reset(self) -> None:
        self._queues.reset()

    def load_pretrained_parts(self) -> None:
        self.diffusion.load_pretrained_backbone()

    def loads_pretrained_parts(self) -> bool:
        return bool(self.config.cameras) and bool(self.config.pretrained_backbone_weights)

    def _cast(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's inputs in its float dtype (--policy.dtype), the environment state split off the
        end of `observation.state` (one vector in our batch, two of LeRobot's); masks and the rest as
        they are."""
        dtype = next(self.diffusion.parameters()).dtype
        keys = {OBS_KEY, *self.diffusion.observation_keys, "action"}
        out = {k: v.to(dtype) if k in keys and v.is_floating_point() else v for k, v in batch.items()}
        env = self.config.env_state_dim
        if env and OBS_KEY in out:
            out[OBS_KEY], out[ENV_KEY] = out[OBS_KEY][..., :-env], out[OBS_KEY][..., -env:]
        return out
