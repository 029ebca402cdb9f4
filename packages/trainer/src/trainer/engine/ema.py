"""The EMA shadow of the trained parameters (`--ema.*`), on every rank in the parameters' own sharding.

LeRobot keeps its EMA on the main process as a full copy, refuses sharded and PEFT runs, and pickles
it. Here each rank holds the shadow of exactly what it holds of each trained parameter: a DTensor of
the same mesh and placements under FSDP2/HSDP (its local shard, never a full copy), a plain tensor
under DDP or one process, and only the trainable parameters of a PEFT model. The update is one
`torch._foreach_lerp_` over the local tensors after each optimizer update: elementwise, so it needs no
collective and a shard's result is bit for bit the full tensor's slice. ckpt_tools saves and loads the
shadow as a weight set of its own, `ema` (`SaveRequest(extra_weights={"ema": shadow})`, and
`load_training_state(extra_weights=...)` on resume).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from trainer.config.ema import EmaConfig
from trainer.distributed.heal_state import local_part


class Ema:
    """The shadow of `model`'s trainable parameters (the unwrapped prepared model: its parameter names
    are the checkpoint's), started as a copy of their current values."""

    def __init__(self, config: EmaConfig, model: nn.Module) -> None:
        self.config = config
        trained = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
        with torch.no_grad():
            self.shadow: dict[str, torch.Tensor] = {name: param.detach().clone() for name, param in trained}
        self._params = [param for _, param in trained]

    @torch.no_grad()
    def update(self, updates: int) -> float:
        """Fold the parameters' current values into the shadow after the `updates`-th optimizer update
        (counted from 1 at the run's first, across resumes); returns the decay used."""
        decay = self.config.decay_at(updates)
        shadow, params = self._local_pairs()
        torch._foreach_lerp_(shadow, params, 1.0 - decay)
        return decay

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run with the shadow in the parameters' place (each rank swaps its own shards, no collective),
        the trained values restored on the way out: evaluation of the EMA weights."""
        shadow, params = self._local_pairs()
        with torch.no_grad():
            trained = [param.clone() for param in params]
            torch._foreach_copy_(params, shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(params, trained)

    def _local_pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """This rank's storage of the shadow and of the parameters, pair by pair (taken at each call:
        the wrapper owns the parameters' storage)."""
        with torch.no_grad():
            return [local_part(v) for v in self.shadow.values()], [local_part(p) for p in self._params]
