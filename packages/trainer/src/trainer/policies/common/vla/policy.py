"""What LeRobot's VLA policies (SmolVLA, pi0, pi0.5) share behind the `Policy` interface: LeRobot's action
queue (`select_action` samples a chunk when the queue is empty and serves its first `n_action_steps`
actions one per call) and the routing of each module to its initializer on the meta device
(transformers' `_init_weights` for the modules transformers built, torch's for the rest)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
from torch import nn

from trainer.config.policy import PolicyConfig
from trainer.policies.common.base import Policy


class VLAPolicy(Policy):
    """A flow-matching VLA: subclasses give `predict_action_chunk` and `initializer_of`."""

    def __init__(self, config: PolicyConfig, n_action_steps: int) -> None:
        super().__init__(config)
        self.n_action_steps = n_action_steps
        self._queue: collections.deque[torch.Tensor] = collections.deque(maxlen=n_action_steps)

    def predict_action_chunk(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A normalized action chunk (B, chunk_size, action_dim)."""
        raise NotImplementedError

    @torch.no_grad()
    def select_action(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The next action of LeRobot's action queue: a chunk sampled every `n_action_steps` calls."""
        if not self._queue:
            chunk = self.predict_action_chunk(batch, noise)[:, : self.n_action_steps]
            self._queue.extend(chunk.transpose(0, 1))
        return self._queue.popleft()

    def reset(self) -> None:
        self._queue.clear()

    def initializer_of(self, module: nn.Module) -> Callable[[nn.Module], None] | None:
        """transformers' initializer of a module transformers built; None for torch's."""
        raise NotImplementedError

    def initializes(self, module: nn.Module) -> bool:
        return self.initializer_of(module) is not None or super().initializes(module)

    def initialize_module(self, module: nn.Module) -> None:
        """transformers' initializer for the modules transformers built, torch's for the rest."""
        initializer = self.initializer_of(module)
        if initializer is None:
            super().initialize_module(module)
        else:
            initializer(module)
