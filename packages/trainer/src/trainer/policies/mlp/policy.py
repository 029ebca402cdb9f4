"""`MLPPolicy`: residual GELU blocks from the observation to one action (L1 loss)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data.dataset import ACTION_KEY, OBS_KEY
from trainer.policies.common.base import Policy
from trainer.policies.mlp.config import MLPConfig


class MLPBlock(nn.Module):
    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(F.gelu(self.linear(x)))


class MLPPolicy(Policy):
    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ("MLPBlock",)
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action",)

    def peft_target_modules(self) -> tuple[str, ...]:
        """LoRA on the hidden blocks."""
        return ("linear",)

    def __init__(self, config: MLPConfig) -> None:
        super().__init__(config)
        self.inp = nn.Linear(config.obs_dim, config.hidden_dim)
        self.blocks = nn.ModuleList(MLPBlock(config.hidden_dim, config.dropout) for _ in range(config.blocks))
        self.out = nn.Linear(config.hidden_dim, config.action_dim)

    def _predict(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.inp(obs)
        for block in self.blocks:
            x = block(x)
        return self.out(x)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred = self._predict(batch[OBS_KEY])
        loss = F.l1_loss(pred, batch[ACTION_KEY][:, 0])
        return loss, {}

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._predict(batch[OBS_KEY])
