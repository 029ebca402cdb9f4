"""`--peft.*`: parameter-efficient fine-tuning, as plain values mapped onto peft's config.

peft is imported only inside `build()`, so parsing a config never imports it. engine/peft_policy.py applies
the config to a policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.errors import ConfigError

PEFT_METHODS = ("LORA",)


@dataclass
class PeftConfig:
    """Train small adapters on a frozen base policy (usually loaded with --policy.path)."""

    method_type: str | None = None
    """LORA trains low-rank adapters beside the frozen weights; unset trains the whole policy."""
    r: int = 16
    """LoRA rank: the inner size of each adapter pair A (r x in) and B (out x r)."""
    alpha: int = 32
    """LoRA scale numerator: the adapter's output is multiplied by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] | None = None
    """Module names (or suffixes) that get adapters; unset takes the policy's `peft_target_modules()`."""
    full_training_modules: list[str] | None = None
    """Modules trained in full beside the adapters (peft's modules_to_save), e.g. a new output head."""

    def __post_init__(self) -> None:
        if self.method_type is not None:
            self.method_type = self.method_type.upper()
            if self.method_type not in PEFT_METHODS:
                raise ConfigError(
                    f"--peft.method_type={self.method_type!r} is not supported: use one of {', '.join(PEFT_METHODS)}"
                )
        if self.r < 1:
            raise ConfigError(f"--peft.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ConfigError(f"--peft.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--peft.dropout must be in [0, 1), got {self.dropout}")
        for name in ("target_modules", "full_training_modules"):
            value = getattr(self, name)
            if value is not None and not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"--peft.{name} must be a list of module names, got {value!r}")
        if self.target_modules == []:
            raise ConfigError("--peft.target_modules is empty: name at least one module, or leave it unset")

    @property
    def enabled(self) -> bool:
        return self.method_type is not None

    def build(self, target_modules: list[str]) -> Any:
        """peft's LoraConfig for the resolved target modules."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(target_modules),
            modules_to_save=list(self.full_training_modules) if self.full_training_modules else None,
        )
