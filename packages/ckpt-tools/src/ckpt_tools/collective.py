"""The process group a collective save or load runs on, and whether the model is sharded.

One process without a process group is a group of one, so saving and loading have a single code path.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


class Group:
    """Rank, size and barrier of the process group a collective runs on; one process without one."""

    def __init__(self, process_group: dist.ProcessGroup | None) -> None:
        self.pg = process_group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if self.distributed else 0
        self.world_size = dist.get_world_size(process_group) if self.distributed else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.pg)


def is_sharded(model: nn.Module) -> bool:
    """True when the parameters are DTensors (FSDP2 or HSDP): the optimizer is then saved as DCP."""
    return any(isinstance(param, DTensor) for param in model.parameters())
