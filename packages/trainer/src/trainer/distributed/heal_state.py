"""What a replica group that (re)joins a fault-tolerant run fetches from a live peer instead of reading
a checkpoint: the state of every rank at the start of the peer's step (docs/fault_tolerance.md).

torchft's Manager calls `GroupState.state_dict` on the live group (when a peer needs healing, at its
quorum, before its forward pass) and ships it over its checkpoint transport (HTTP); the healing group's
Manager hands it to `load_state_dict` before its own first forward pass. The state is the one a resume
restores, taken from memory: model, optimizer, LR schedule, the weight sets kept beside the model (the
EMA), the sampler's position in the global order and the RNG. Each rank of a group exchanges with the
same rank of the peer, which holds the same shards (the groups are launched alike), so a tensor travels
as this rank's part (an FSDP2 rank's local shard, a plain tensor: a DTensor's mesh is the sender's) and
lands in place: the model's and the EMA's tensors are copied into, the optimizer's sharded state is
rebuilt as DTensors on the healing rank's own mesh (its optimizer may hold no state yet).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.distributed.tensor import DTensor

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
            "model": {name: local_part(value) for name, value in self.model.state_dict().items()},
            "optimizer": _local_optimizer_state(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.position,
            "extra_weights": {
                name: {key: local_part(value) for key, value in weights.items()}
                for name, weights in self.extra_weights.items()
            },
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a peer's state over, in place, as of the start of the peer's step."""
        _check_same_layout(self.model, state["model"])
        with torch.no_grad():
            for name, value in self.model.state_dict().items():
                local_part(value).copy_(state["model"][name])
            for name, weights in self.extra_weights.items():
                for key, value in weights.items():
                    local_part(value).copy_(state["extra_weights"][name][key])
        self.optimizer.load_state_dict(_sharded_optimizer_state(state["optimizer"], self.optimizer))
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.set_position(*state["sampler"])
        set_rng_state(state["rng"])

    def weights(self) -> list[torch.Tensor]:
        """This rank's part of each of the model's tensors (the state dict's order), then of each
        weight set kept beside it (the EMA)."""
        kept = [value for weights in self.extra_weights.values() for value in weights.values()]
        return [local_part(value) for value in [*self.model.state_dict().values(), *kept]]

    def optimizer_tensors(self) -> list[torch.Tensor]:
        """This rank's part of each tensor of the optimizer's state (moments, step counters), in order."""
        state = self.optimizer.state_dict()["state"]
        return [
            local_part(state[index][key])
            for index in sorted(state)
            for key in sorted(state[index])
            if isinstance(state[index][key], torch.Tensor)
        ]


SHARDED = "sharded"
"""The key beside an optimizer state dict's own that lists, per parameter index, the state entries
that were DTensors on the sending rank (sent as their local shards)."""


LAYOUT_DIFFERS = (
    "this replica group holds its model in other shards than the live peer it heals from: launch every "
    "group with the same --nproc-per-node and --parallelism.* flags"
)


def _check_same_layout(model: torch.nn.Module, sent: dict[str, torch.Tensor]) -> None:
    """One line when the peer's tensors are not this rank's parts (a group launched differently)."""
    mine = {name: local_part(value).shape for name, value in model.state_dict().items()}
    if mine != {name: value.shape for name, value in sent.items()}:
        raise RunFailedError(LAYOUT_DIFFERS)


def local_part(value: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: an FSDP2 DTensor's local shard, else the tensor itself."""
    return value.to_local() if isinstance(value, DTensor) else value


def _local_optimizer_state(saved: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict with every DTensor replaced by its local shard, and which they were."""
    state = {
        index: {key: local_part(value) for key, value in entry.items()}
        for index, entry in saved["state"].items()
    }
    sharded = {
        index: sorted(key for key, value in entry.items() if isinstance(value, DTensor))
        for index, entry in saved["state"].items()
    }
    return {**saved, "state": state, SHARDED: sharded}


def _sharded_optimizer_state(sent: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A peer's optimizer state dict as this rank's optimizer loads it: each entry that was a DTensor
    there becomes one again here, this rank's shard on the mesh and placements of the parameter it
    belongs to (the optimizer's state is keyed by the parameters' order in its groups)."""
    params = [param for group in optimizer.param_groups for param in group["params"]]
    state = {}
    for index, entry in sent["state"].items():
        sharded, param = set(sent[SHARDED][index]), params[index]
        state[index] = {
            key: _on_mesh_of(param, value) if key in sharded else value for key, value in entry.items()
        }
    return {key: value for key, value in sent.items() if key != SHARDED} | {"state": state}


def _on_mesh_of(param: torch.Tensor, shard: torch.Tensor) -> DTensor:
    """`shard` as the DTensor of this rank's part of a tensor laid out like `param`."""
    if not isinstance(param, DTensor):
        raise RunFailedError(LAYOUT_DIFFERS)
    return DTensor.from_local(
        shard,
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )


def rng_state() -> dict[str, Any]:
    """The process's random number generators' states (torch, CUDA, numpy, Python)."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Set the generators back to a `rng_state()`."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
