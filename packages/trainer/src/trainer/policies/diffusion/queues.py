"""LeRobot's `DiffusionPolicy.select_action`: an observation history and the queued actions of a chunk.

Each call appends the current observation to its history (a history not yet full, at an episode's
start, is filled with copies of it); when no action is queued, the model samples a chunk from the
history and its `n_action_steps` actions are queued. Each call returns the next queued action, so the
model runs every `n_action_steps` calls.
"""

from __future__ import annotations

from collections import deque

import torch

from trainer.policies.diffusion.model import DiffusionModel


class ActionQueue:
    """The rollout state of one Diffusion Policy (`reset()` at every episode start)."""

    def __init__(self, model: DiffusionModel) -> None:
        self.model = model
        self.history: dict[str, deque[torch.Tensor]] = {}
        self.actions: deque[torch.Tensor] = deque()
        self.reset()

    def reset(self) -> None:
        self.history = {
            key: deque(maxlen=self.model.config.n_obs_steps) for key in self.model.observation_keys
        }
        self.actions = deque(maxlen=self.model.config.n_action_steps)

    def select_action(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The (B, A) action for one observation step: `batch` holds each key of
        `model.observation_keys` without a step axis (state (B, D), cameras (B, C, H, W)), normalized;
        `noise` is the initial sample of a chunk this call samples (drawn when None)."""
        steps = self.model.config.n_obs_steps
        for key, history in self.history.items():
            history.extend([batch[key]] * max(steps - len(history), 1))  # full: the oldest drops out
        if not self.actions:
            stacked = {key: torch.stack(list(history), dim=1) for key, history in self.history.items()}
            self.actions.extend(self.model.sample_actions(stacked, noise).transpose(0, 1))
        return self.actions.popleft()
