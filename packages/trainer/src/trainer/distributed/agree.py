"""Decisions the main rank takes alone and every rank must share.

A rank that reads `checkpoints/last` on its own may see another step than its peers (a job moving `last`
while this one starts), and a rank that writes alone may fail while the others wait for it in the next
collective. Both are solved the same way: the main rank computes, the outcome (the value, or the one-line
error) is broadcast, and every rank continues with the same value or raises the same error at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from trainer.errors import ConfigError

T = TypeVar("T")


def main_decides(compute: Callable[[], T]) -> T:
    """Collective when a process group is up: call on all ranks. `compute` runs on rank 0 only and its
    result is returned on every rank. When it raises, every rank raises `ConfigError` with the same line
    (rank 0 re-raises an unexpected exception type as is, so a bug keeps its traceback there)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return compute()
    box: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            box[0] = (True, compute())
        except Exception as exc:  # every rank must hear about it, or they wait for rank 0 for ever
            failure = exc
            box[0] = (False, one_line(exc))
    dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if ok:
        return value
    if failure is not None and not _expected(failure):
        raise failure
    raise ConfigError(value) from None


def one_line(exc: BaseException) -> str:
    """An error as the one line the CLI prints: the message of our own errors, else type and message."""
    text = " ".join(str(exc).split())
    return text if _expected(exc) else f"{type(exc).__name__}: {text}"


def _expected(exc: BaseException) -> bool:
    """Errors whose message is written for the user (ours and ckpt_tools'), printed without a type."""
    import ckpt_tools

    return isinstance(exc, ConfigError | ckpt_tools.CheckpointError)
