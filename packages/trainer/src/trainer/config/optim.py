"""The optimizer and the learning-rate schedule: LeRobot's types and field names, and the engine's own.

`--optimizer.type` and `--scheduler.type` pick a subclass, as in LeRobot (`lerobot/optim`): `adamw`,
`adam`, `sgd`; `cosine_decay_with_warmup`, with LeRobot's fields (`grad_clip_norm`, `num_warmup_steps`,
`num_decay_steps`, `peak_lr`, `decay_lr`). The engine's earlier names stay: an optimizer section
without a type is `adamw` (whose defaults are the engine's: lr 2e-3, weight decay 1e-4), and the
schedules `cosine` (warmup, then a cosine from the end of warmup to `min_lr_ratio`) and `constant`, so
a train_config.json written before these types existed resumes with the schedule it started with.

A policy config's `get_optimizer_preset()` / `get_scheduler_preset()` return these objects
(`--use_policy_training_preset`, docs/training.md). Building imports torch only inside `build()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import draccus

from trainer.errors import ConfigError

if TYPE_CHECKING:
    import torch

ENGINE_LR = 2e-3  # the engine's default peak rate, kept for existing commands and configs


@dataclass
class OptimizerConfig(draccus.ChoiceRegistry):
    """Base of `--optimizer.type` choices: a torch optimizer and the gradient clipping before it."""

    lr: float = ENGINE_LR
    """Peak learning rate (adam and sgd: 0.001 by default, as in LeRobot)."""
    weight_decay: float = 1e-4
    """Weight decay: decoupled for adamw, an L2 penalty for adam and sgd (0 by default for both)."""
    grad_clip_norm: float = 10.0
    """Clip the global gradient norm before each update; 0 disables clipping."""

    @classmethod
    def default_choice_name(cls) -> str:
        return "adamw"  # an optimizer section without a type (every config written before types)

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"--optimizer.lr must be > 0, got {self.lr}")
        if self.grad_clip_norm < 0:
            raise ConfigError(f"--optimizer.grad_clip_norm must be >= 0, got {self.grad_clip_norm}")

    def build(self, params: Any) -> torch.optim.Optimizer:
        """The optimizer over `params` (parameters, or groups that may carry their own `lr`)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The banner's words: "AdamW lr 1e-05 (weight decay 0.0001, clip 10)"."""
        clip = f"clip {self.grad_clip_norm:g}" if self.grad_clip_norm else "no clipping"
        return (
            f"{_NAMES.get(self.type, self.type)} lr {self.lr:g} (weight decay {self.weight_decay:g}, {clip})"
        )


@OptimizerConfig.register_subclass("adamw")
@dataclass
class AdamWConfig(OptimizerConfig):
    """torch.optim.AdamW (decoupled weight decay)."""

    betas: tuple[float, float] = (0.9, 0.999)
    """Adam moment coefficients."""
    eps: float = 1e-8
    """Adam epsilon."""

    def build(self, params: Any) -> torch.optim.Optimizer:
        import torch

        betas = (self.betas[0], self.betas[1])
        return torch.optim.AdamW(
            params, lr=self.lr, weight_decay=self.weight_decay, betas=betas, eps=self.eps
        )


@OptimizerConfig.register_subclass("adam")
@dataclass
class AdamConfig(OptimizerConfig):
    """torch.optim.Adam (L2 weight decay), LeRobot's defaults."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam moment coefficients."""
    eps: float = 1e-8
    """Adam epsilon."""

    def build(self, params: Any) -> torch.optim.Optimizer:
        import torch

        betas = (self.betas[0], self.betas[1])
        return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay, betas=betas, eps=self.eps)


@OptimizerConfig.register_subclass("sgd")
@dataclass
class SGDConfig(OptimizerConfig):
    """torch.optim.SGD, LeRobot's defaults."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0
    """Momentum factor."""
    dampening: float = 0.0
    """Dampening of the momentum."""
    nesterov: bool = False
    """Nesterov momentum."""

    def build(self, params: Any) -> torch.optim.Optimizer:
        import torch

        return torch.optim.SGD(
            params,
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            dampening=self.dampening,
            nesterov=self.nesterov,
        )


_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


@dataclass
class SchedulerConfig(draccus.ChoiceRegistry):
    """Base of `--scheduler.type` choices: a factor on every group's rate, stepped once per loop step
    whatever the process count."""

    @classmethod
    def default_choice_name(cls) -> str:
        return "cosine"

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    def factor(self, step: int, total_steps: int) -> float:
        """The multiple of each group's own rate at loop step `step` of a `total_steps` run."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def build(self, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
        import torch

        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.factor(step, total_steps))


@dataclass
class _WarmupConfig(SchedulerConfig):
    """The engine's schedules: a linear warmup, then `after_warmup`."""

    warmup_steps: int = 20
    """Linear warmup from 0 over this many loop steps."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak (used by cosine; constant records it unused)."""

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ConfigError(f"--scheduler.warmup_steps must be >= 0, got {self.warmup_steps}")

    def factor(self, step: int, total_steps: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        return self.after_warmup(step, total_steps)

    def after_warmup(self, step: int, total_steps: int) -> float:
        raise NotImplementedError

    def _warmup_words(self) -> str:
        return f", {self.warmup_steps}-step warmup" if self.warmup_steps else ""


@SchedulerConfig.register_subclass("cosine")
@dataclass
class CosineConfig(_WarmupConfig):
    """The engine's cosine: warmup, then a cosine from the peak to min_lr_ratio over the rest of the run."""

    def after_warmup(self, step: int, total_steps: int) -> float:
        progress = min(1.0, (step - self.warmup_steps) / max(1, total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def describe(self) -> str:
        return f"cosine to {self.min_lr_ratio:g} x peak at the last step{self._warmup_words()}"


@SchedulerConfig.register_subclass("constant")
@dataclass
class ConstantConfig(_WarmupConfig):
    """The rate of the optimizer throughout (after the warmup, if any); LeRobot's "no scheduler" is
    this with warmup_steps=0."""

    def after_warmup(self, step: int, total_steps: int) -> float:
        return 1.0

    def describe(self) -> str:
        return f"constant{self._warmup_words()}"


@SchedulerConfig.register_subclass("cosine_decay_with_warmup")
@dataclass
class CosineDecayWithWarmupConfig(SchedulerConfig):
    """LeRobot's (Physical Intelligence's) schedule: linear warmup from peak/(warmup+1), then a cosine
    over `num_decay_steps` counted from step 0 down to `decay_lr`; a run shorter than num_decay_steps
    compresses warmup and decay into its length, as LeRobot does."""

    num_warmup_steps: int = 1_000
    """Warmup steps."""
    num_decay_steps: int = 30_000
    """Steps of the cosine, counted from the first step."""
    peak_lr: float = 2.5e-5
    """The rate the schedule names as its peak: decay_lr / peak_lr is the
    final factor on the optimizer's own rate (LeRobot's presets set it equal to --optimizer.lr)."""
    decay_lr: float = 2.5e-6
    """The rate at the end of the decay."""

    def __post_init__(self) -> None:
        if self.num_warmup_steps < 0 or self.num_decay_steps < 1:
            raise ConfigError(
                "--scheduler.num_warmup_steps must be >= 0 and --scheduler.num_decay_steps >= 1, got "
                f"{self.num_warmup_steps} and {self.num_decay_steps}"
            )
        if self.peak_lr <= 0:
            raise ConfigError(f"--scheduler.peak_lr must be > 0, got {self.peak_lr}")

    def factor(self, step: int, total_steps: int) -> float:
        warmup, decay = self.num_warmup_steps, self.num_decay_steps
        if total_steps < decay:  # LeRobot's auto-scaling of a run shorter than the decay
            warmup, decay = int(warmup * total_steps / decay), total_steps
        if step < warmup:
            return (step + 1) / (warmup + 1)
        final = self.decay_lr / self.peak_lr
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(step, decay) / decay))

    def describe(self) -> str:
        return (
            f"cosine_decay_with_warmup ({self.num_warmup_steps} warmup steps, decay over "
            f"{self.num_decay_steps} steps to {self.decay_lr:g})"
        )
