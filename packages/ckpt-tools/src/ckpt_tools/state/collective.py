"""The process group a collective save or load runs on, and whether the model is sharded.

One process without a process group is a group of one, so saving and loading have a single code path.
Work that only the main rank does inside a collective (gathered files, side files, the commit) must not
leave the other ranks waiting for it when it fails: `Group.on_main` records the main rank's failure
instead of raising it, the ranks go on through the collectives they share, and `Group.agree` (which
replaces a barrier) broadcasts the outcome so that every rank raises the same `SaveFailedError` line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ckpt_tools.errors import CheckpointError, SaveFailedError, one_line

T = TypeVar("T")


class Group:
    """Rank, size and barrier of the process group a collective runs on; one process without one."""

    def __init__(self, process_group: dist.ProcessGroup | None) -> None:
        self.pg = process_group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if self.distributed else 0
        self.world_size = dist.get_world_size(process_group) if self.distributed else 1
        self.failure: str | None = None  # the main rank's first failure, until `agree` shares it
        self._cause: Exception | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.pg)

    def on_main(self, action: Callable[..., Any], *args: Any, all_ranks: bool = False) -> None:
        """Run `action(*args)` on the main rank only (on every rank with `all_ranks`: a collective whose
        writing is the main rank's); a main-rank failure is kept for `agree` instead of raised."""
        if not self.is_main:
            if all_ranks:
                action(*args)
            return
        if self.failure is not None and not all_ranks:
            return  # after a failure, main-only work (a commit) must not go on
        try:
            action(*args)
        except Exception as exc:  # the other ranks must hear of it at the next `agree`
            if self.failure is None:
                self.failure, self._cause = one_line(exc), exc

    def gather_to_main(self, value: Any) -> list[Any]:
        """Collective: every rank's `value`, in rank order, on the main rank (empty elsewhere)."""
        if not self.distributed:
            return [value]
        gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(value, gathered, group=self.pg, group_dst=0)
        return gathered or []

    def agree(self, what: str) -> None:
        """Collective (a barrier): raise `SaveFailedError` on every rank when the main rank failed, the
        message naming the main rank's `what` (the main rank alone may know which phase failed)."""
        failure = self.failure
        if self.distributed:
            box = [(what, failure)]
            dist.broadcast_object_list(box, group=self.pg, group_src=0)
            what, failure = box[0]
        if failure is not None:
            raise SaveFailedError(f"{what} failed on the main rank: {failure}") from self._cause


def main_decides(
    compute: Callable[[], T],
    *,
    error: Callable[[str], Exception],
    expected: tuple[type[BaseException], ...] = (CheckpointError,),
    group: dist.ProcessGroup | None = None,
) -> T:
    """Collective when a process group is up: call on all ranks. `compute` runs on the main rank only
    and its value is returned on every rank; when it raises, every rank raises `error(line)` with the
    same one line, so no rank waits for ever for a peer that failed alone (a rank reading `last` on its
    own could also see another step than its peers). A failure that is not one of the `expected` types
    (a bug) is re-raised as it is on the main rank, its traceback kept; the others raise `error`.
    `group` is the process group to broadcast on (the default one when None)."""
    if not (dist.is_available() and dist.is_initialized()):
        return compute()
    box: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            box[0] = (True, compute())
        except Exception as exc:  # every rank must hear about it, or they wait for the main rank
            failure = exc
            box[0] = (False, one_line(exc, expected))
    dist.broadcast_object_list(box, src=0, group=group)
    ok, value = box[0]
    if ok:
        return cast(T, value)  # what compute() returned on the main rank, unpickled
    if failure is not None and not isinstance(failure, expected):
        raise failure
    raise error(value) from None


def is_sharded(model: nn.Module) -> bool:
    """True when the parameters are DTensors (FSDP2 or HSDP): the optimizer is then saved as DCP."""
    return any(isinstance(param, DTensor) for param in model.parameters())
