"""The toy policy's module: every hook `trainer.policies.common.base.Policy` declares, each doing something."""

from __future__ import annotations

import collections
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from helpers.toy_policy.config import ToyConfig
from trainer.policies.common.base import Policy

STATE, ACTION = "observation.state", "action"
SEEN: list[dict[str, tuple[int, ...]]] = []
"""The shapes of every training batch any toy policy saw (what a test asserts the data layer gave)."""


class ToyBlock(nn.Module):
    """One FSDP unit: a residual MLP layer whose forward runs."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.proj(x))


class ToyPolicy(Policy):
    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ("ToyBlock",)
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action",)

    def __init__(self, config: ToyConfig) -> None:
        super().__init__(config)
        self.config: ToyConfig = config
        width = config.hidden_dim
        self.encoder = nn.Linear(config.obs_dim * config.n_obs_steps, width)
        self.blocks = nn.ModuleList(ToyBlock(width) for _ in range(2))
        self.head = nn.Linear(width, config.action_dim * config.horizon)
        self._history: collections.deque[torch.Tensor] = collections.deque(maxlen=config.n_obs_steps)

    def peft_target_modules(self) -> tuple[str, ...]:
        return ("proj",)

    def parameter_groups(self) -> dict[str, float]:
        return {"encoder": self.config.lr / 10}  # the encoder at a tenth of the rate

    def _chunk(self, states: torch.Tensor) -> torch.Tensor:
        x = self.encoder(states.flatten(1))
        for block in self.blocks:
            x = block(x)
        return self.head(x).view(len(states), self.config.horizon, self.config.action_dim)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        SEEN.append({key: tuple(value.shape) for key, value in batch.items()})
        error = F.mse_loss(self._chunk(batch[STATE]), batch[ACTION], reduction="none").mean(-1)
        kept = ~batch["action_is_pad"]  # padded action frames give no loss
        return (error * kept).sum() / kept.sum().clamp_min(1), {}

    def reset(self) -> None:
        self._history.clear()

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The history a robot gives one frame at a time: the first frame repeated until it fills, as the
        dataset pads an episode's start."""
        while len(self._history) < self.config.n_obs_steps - 1:
            self._history.append(batch[STATE])
        self._history.append(batch[STATE])
        return self._chunk(torch.stack(list(self._history), dim=1))[:, self.config.n_obs_steps - 1]
