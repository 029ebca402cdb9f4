"""LeRobot's `DiffusionModel`: observations to global conditioning, the denoising loss, and sampling.

Its tensors are named as under LeRobot's `DiffusionPolicy.diffusion` (`rgb_encoder.*`, `unet.*`): a
policy holding it as `diffusion` loads LeRobot's model.safetensors strictly, no renaming. Every random
draw comes from torch's global generator in LeRobot's order and shapes (the crop offsets, then the
noise, then the timesteps; the initial sample, then one variance noise per DDPM step), so a seeded run
reproduces LeRobot's numbers.

A batch holds `observation.state` (B, S, D), each camera (B, S, C, H, W) normalized, optionally
`observation.environment_state` (B, S, E), with S = n_obs_steps (a 1-step batch may omit the S axis),
and for the loss `action` (B, horizon, A) with `action_is_pad` (B, horizon).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data.dataset import ACTION_KEY, ENV_KEY, OBS_KEY, PAD_KEY
from trainer.errors import ConfigError
from trainer.policies.diffusion.config import DiffusionConfig, DiffusionFeatures
from trainer.policies.diffusion.unet import ConditionalUnet1d
from trainer.policies.diffusion.vision import RgbEncoder


def make_noise_scheduler(config: DiffusionConfig) -> Any:
    """diffusers' DDPM or DDIM scheduler, built with exactly the arguments LeRobot passes (diffusers'
    defaults for the rest: fixed_small variance, leading timestep spacing, DDIM's eta 0). Its tables
    are plain CPU tensors, not module state, so they are built on the CPU even inside a meta-device
    build (diffusers moves them to the samples' device where it needs them)."""
    try:
        from diffusers import DDIMScheduler, DDPMScheduler
    except ImportError:
        raise ConfigError(
            "--policy.type=diffusion needs diffusers: pip install 'ckpt-trainer[diffusion]'"
        ) from None
    scheduler = DDPMScheduler if config.noise_scheduler_type == "DDPM" else DDIMScheduler
    with torch.device("cpu"):
        return scheduler(
            num_train_timesteps=config.num_train_timesteps,
            beta_start=config.beta_start,
            beta_end=config.beta_end,
            beta_schedule=config.beta_schedule,
            clip_sample=config.clip_sample,
            clip_sample_range=config.clip_sample_range,
            prediction_type=config.prediction_type,
        )


class DiffusionModel(nn.Module):
    """The camera encoders, the U-Net and the noise scheduler of one Diffusion Policy."""

    def __init__(self, config: DiffusionConfig, features: DiffusionFeatures) -> None:
        super().__init__()
        config.check_features(features)
        self.config, self.features = config, features
        self.cameras = list(features.cameras)
        per_step = features.state_dim + features.env_state_dim
        if self.cameras:
            frame = features.cameras[self.cameras[0]]
            count = len(self.cameras) if config.use_separate_rgb_encoder_per_camera else 1
            encoders = [RgbEncoder(config, frame) for _ in range(count)]
            self.rgb_encoder: nn.Module = (
                nn.ModuleList(encoders) if config.use_separate_rgb_encoder_per_camera else encoders[0]
            )
            per_step += encoders[0].feature_dim * len(self.cameras)
        self.unet = ConditionalUnet1d(config, features.action_dim, per_step * config.n_obs_steps)
        self.noise_scheduler = make_noise_scheduler(config)
        self.num_inference_steps = config.num_inference_steps or config.num_train_timesteps

    @property
    def observation_keys(self) -> list[str]:
        """The batch keys the model reads for one observation step, in conditioning order."""
        return [OBS_KEY, *self.cameras, *([ENV_KEY] if self.features.env_state_dim else [])]

    def load_pretrained_backbone(self) -> None:
        """The config's `pretrained_backbone_weights` into every camera trunk (a fresh build's start)."""
        source = self.config.pretrained_backbone_weights
        if not source:
            return
        for encoder in (module for module in self.modules() if isinstance(module, RgbEncoder)):
            encoder.load_pretrained_backbone(source)

    def global_conditioning(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, n_obs_steps * per-step features): per step `[state, camera features in camera order,
        environment state]`, the oldest step first."""
        steps = {key: self._with_steps(batch[key], key) for key in self.observation_keys}
        parts = [steps[OBS_KEY]]
        if self.cameras:
            parts.append(self.image_features(torch.stack([steps[name] for name in self.cameras], dim=2)))
        if self.features.env_state_dim:
            parts.append(steps[ENV_KEY])
        return torch.cat(parts, dim=-1).flatten(start_dim=1)

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, S, N, C, H, W) -> (B, S, N * F). A shared encoder sees all frames in one call, `(b s n)`
        order; separate ones one call per camera, in camera order (which is the order their crops draw)."""
        batch, steps = images.shape[:2]
        if isinstance(self.rgb_encoder, nn.ModuleList):
            per_camera = [
                encoder(images[:, :, index].flatten(0, 1)) for index, encoder in enumerate(self.rgb_encoder)
            ]
            return torch.stack(per_camera, dim=1).reshape(batch, steps, -1)
        return self.rgb_encoder(images.flatten(0, 2)).reshape(batch, steps, -1)

    def _with_steps(self, value: torch.Tensor, key: str) -> torch.Tensor:
        per_step = 3 if key in self.cameras else 1
        if value.ndim == per_step + 1 and self.config.n_obs_steps == 1:
            value = value.unsqueeze(1)
        if value.ndim != per_step + 2 or value.shape[1] != self.config.n_obs_steps:
            raise ValueError(
                f"{key} has shape {list(value.shape)}: Diffusion Policy reads (batch, n_obs_steps="
                f"{self.config.n_obs_steps}, ...) for it; give the dataset observation offsets of that length"
            )
        return value

    def compute_loss(self, batch: dict[str, torch.Tensor], reduction: str = "mean") -> torch.Tensor:
        """LeRobot's training loss: the actions noised at a random timestep per sample, the U-Net's
        prediction against the noise (epsilon) or the actions (sample). `reduction="mean"`: the scalar
        LeRobot back-propagates (over non-padded steps under do_mask_loss_for_padding); "none": the
        (B, horizon, A) squared errors, unmasked."""
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction={reduction!r}: choose mean or none")
        global_cond = self.global_conditioning(batch)
        trajectory = batch[ACTION_KEY]
        if trajectory.shape[1] != self.config.horizon:
            raise ValueError(
                f"{ACTION_KEY} has {trajectory.shape[1]} steps, --policy.horizon={self.config.horizon}: "
                "give the dataset action offsets of the horizon's length"
            )
        eps = torch.randn(trajectory.shape, device=trajectory.device)
        timesteps = torch.randint(
            0, self.config.num_train_timesteps, (trajectory.shape[0],), device=trajectory.device
        ).long()
        noisy = self.noise_scheduler.add_noise(trajectory, eps, timesteps)
        pred = self.unet(noisy, timesteps, global_cond)
        target = eps if self.config.prediction_type == "epsilon" else trajectory
        loss = F.mse_loss(pred, target, reduction="none")
        if reduction == "none":
            return loss
        if not self.config.do_mask_loss_for_padding:
            return loss.mean()
        if PAD_KEY not in batch:
            raise ValueError(f"--policy.do_mask_loss_for_padding=true needs {PAD_KEY} in the batch")
        mask = (~batch[PAD_KEY]).unsqueeze(-1)
        return (loss * mask).sum() / (mask.sum() * loss.shape[-1]).clamp_min(1)

    def sample_chunk(self, global_cond: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """A (B, horizon, A) action chunk denoised from `noise` (drawn when None) in num_inference_steps
        scheduler steps."""
        parameter = next(self.parameters())
        sample = (
            noise
            if noise is not None
            else torch.randn(
                (global_cond.shape[0], self.config.horizon, self.features.action_dim),
                dtype=parameter.dtype,
                device=parameter.device,
            )
        )
        self.noise_scheduler.set_timesteps(self.num_inference_steps)
        for t in self.noise_scheduler.timesteps:
            timesteps = torch.full(sample.shape[:1], t, dtype=torch.long, device=sample.device)
            prediction = self.unet(sample, timesteps, global_cond)
            sample = self.noise_scheduler.step(prediction, t, sample).prev_sample
        return sample

    @torch.no_grad()
    def sample_actions(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The (B, n_action_steps, A) actions to execute: the sampled chunk from the current step on."""
        chunk = self.sample_chunk(self.global_conditioning(batch), noise)
        start = self.config.n_obs_steps - 1
        return chunk[:, start : start + self.config.n_action_steps]
