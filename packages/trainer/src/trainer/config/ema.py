"""`--ema.*`: an exponential moving average of the trained parameters, as plain values.

The decay schedule is LeRobot's (diffusion_policy's `EMAModel`, @crowsonkb's warmup): after the
`n`-th optimizer update, with `k = n - update_after_step - 1`, the decay is 0 while `k <= 0` (the
shadow copies the weights) and then `1 - (1 + k / inv_gamma) ** -power`, clamped to
`[min_decay, min(max_decay, decay)]`; `power=0` turns the warmup off (`decay` at once, within the same bounds).
engine/ema.py keeps the shadow.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.errors import ConfigError


@dataclass
class EmaConfig:
    """Keep an EMA of the trained parameters on every rank, in their own sharding, saved with each
    checkpoint as a weight set of its own."""

    enable: bool = False
    """Keep the EMA shadow, update it after each optimizer update and save it in every checkpoint."""
    decay: float = 0.9999
    """The EMA's decay once warmed up, in (0, 1): the weight the shadow keeps at each update."""
    update_after_step: int = 0
    """Optimizer updates during which the shadow only copies the weights (decay 0)."""
    inv_gamma: float = 1.0
    """Warmup time scale: the decay is 1 - (1 + k / inv_gamma) ** -power after k counted updates."""
    power: float = 2 / 3
    """Warmup exponent (2/3 reaches 0.999 after about 31.6K updates, 3/4 after 10K); 0: no warmup."""
    min_decay: float = 0.0
    """Lower bound of the warmed-up decay."""
    max_decay: float = 0.9999
    """Upper bound of the warmed-up decay (LeRobot's name; `decay` bounds it too)."""
    use_for_eval: bool = True
    """Evaluate the EMA weights at the end of training (the rollouts), instead of the trained ones."""

    def __post_init__(self) -> None:
        if not 0 < self.decay < 1:
            raise ConfigError(f"--ema.decay must be in (0, 1), got {self.decay}")
        if self.update_after_step < 0:
            raise ConfigError(f"--ema.update_after_step must be >= 0, got {self.update_after_step}")
        if self.inv_gamma <= 0:
            raise ConfigError(f"--ema.inv_gamma must be > 0, got {self.inv_gamma}")
        if self.power < 0:
            raise ConfigError(f"--ema.power must be >= 0 (0: no warmup), got {self.power}")
        if not 0 <= self.min_decay <= self.max_decay < 1:
            raise ConfigError(
                f"--ema.min_decay and --ema.max_decay must satisfy 0 <= min_decay <= max_decay < 1, "
                f"got {self.min_decay} and {self.max_decay}"
            )

    def decay_at(self, updates: int) -> float:
        """The decay of the `updates`-th optimizer update (counted from 1 at the run's first)."""
        counted = updates - self.update_after_step - 1
        if counted <= 0:
            return 0.0
        warm = self.decay if self.power == 0 else 1 - (1 + counted / self.inv_gamma) ** -self.power
        return max(self.min_decay, min(warm, self.max_decay, self.decay))
