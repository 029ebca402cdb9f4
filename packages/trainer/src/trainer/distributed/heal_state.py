"""What a replica group that (re)joins a fault-tolerant run fetches from a live peer instead of reading
a checkpoint: the state of every rank at the start of the peer's step (docs/fault_tolerance.md).

torchft's Manager calls `GroupState.state_dict` on the live group (when a peer needs healing, at its
quorum, before its forward pass) and ships it over its checkpoint transport (HTTP); the healing group's
Manager hands it to `load_state_dict` before its own first forward pass. The state is the one a resume
restores, taken from memory: model, optimizer, LR schedule, the weight sets kept beside the model (the
EMA), the sampler's position in the global order and the RNG. Each rank of a group exchanges with the
same rank of the peer, so a tensor travels as this rank's part (an FSDP2 rank's local shard) and lands
in place; healing a group sharded with FSDP2 is not built yet (one line).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from trainer.data.pipeline.sampler import GlobalOrderSampler
from trainer.errors import RunFailedError


class Schedule(Protocol):
    """The LR schedule as the group state uses it (accelerate's wrapper and torch's schedulers)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass
class GroupState:
    """The live objects of one rank whose state a healing peer takes over."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Schedule
    sampler: GlobalOrderSampler
    extra_weights: dict[str, dict[str, torch.Tensor]]
    """The weight sets kept beside the model, by name (`ema`), each updated in place."""

    def state_dict(self) -> dict[str, Any]:
        """This rank's state at the start of a step: plain tensors (local shards), picklable."""
        return {
            "model": {name: _local(value) for name, value in self.model.state_dict().items()},
            "optimizer": self._optimizer_state(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.position,
            "extra_weights": {
                name: {key: _local(value) for key, value in weights.items()}
                for name, weights in self.extra_weights.items()
            },
            "rng": _rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a peer's state over, in place, as of the start of the peer's step."""
        self._check_unsharded()
        with torch.no_grad():
            for name, value in self.model.state_dict().items():
                _local(value).copy_(state["model"][name])
            for name, weights in self.extra_weights.items():
                for key, value in weights.items():
                    _local(value).copy_(state["extra_weights"][name][key])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.set_position(*state["sampler"])
        _set_rng_state(state["rng"])

    def _optimizer_state(self) -> dict[str, Any]:
        saved = self.optimizer.state_dict()
        state = {
            index: {key: _local(value) for key, value in entry.items()}
            for index, entry in saved["state"].items()
        }
        return {**saved, "state": state}

    def _check_unsharded(self) -> None:
        """A sharded optimizer's state cannot yet be rebuilt from a peer's local shards."""
        if any(hasattr(param, "to_local") for param in self.model.parameters()):
            raise RunFailedError(
                "healing a replica group sharded with FSDP2 from its peer is not built yet: relaunch every "
                "group with --resume=true (a group of one process heals)"
            )


def _local(value: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: an FSDP2 DTensor's local shard, else the tensor itself."""
    return value.to_local() if hasattr(value, "to_local") else value


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
