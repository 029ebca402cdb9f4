"""The training preset LeRobot's VLAs share (SmolVLA, pi0, pi0.5; openpi's): AdamW and the cosine decay
with warmup, from the config's own `optimizer_*` / `scheduler_*` fields, so `--policy.<field>` flags
change them (--use_policy_training_preset=true, docs/training.md)."""

from __future__ import annotations

from typing import Protocol

from trainer.config.optim import AdamWConfig, CosineDecayWithWarmupConfig


class PresetFields(Protocol):
    """The preset's fields on a VLA config (LeRobot's names)."""

    optimizer_lr: float
    optimizer_betas: tuple[float, float]
    optimizer_eps: float
    optimizer_weight_decay: float
    optimizer_grad_clip_norm: float
    scheduler_warmup_steps: int
    scheduler_decay_steps: int
    scheduler_decay_lr: float


def adamw(config: PresetFields) -> AdamWConfig:
    """LeRobot's VLA optimizer preset: AdamW from the optimizer_* fields."""
    return AdamWConfig(
        lr=config.optimizer_lr,
        betas=config.optimizer_betas,
        eps=config.optimizer_eps,
        weight_decay=config.optimizer_weight_decay,
        grad_clip_norm=config.optimizer_grad_clip_norm,
    )


def cosine_decay(config: PresetFields) -> CosineDecayWithWarmupConfig:
    """LeRobot's VLA schedule: warmup to optimizer_lr, cosine decay to scheduler_decay_lr."""
    return CosineDecayWithWarmupConfig(
        num_warmup_steps=config.scheduler_warmup_steps,
        num_decay_steps=config.scheduler_decay_steps,
        peak_lr=config.optimizer_lr,
        decay_lr=config.scheduler_decay_lr,
    )
