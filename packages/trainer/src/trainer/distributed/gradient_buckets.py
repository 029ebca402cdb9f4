"""The gradients a replica group averages with the other live groups (distributed/fault_tolerance.py)
travel in flat buckets: runs of one dtype and device, bounded in size, so that a few exchanges carry
them rather than one per parameter (each of torchft's exchanges has a fixed cost: a future, its
timeout, a callback). The average of a flat bucket is the per-tensor one, element for element, and
each averaged tensor is copied back where it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

Allreduce = Callable[[torch.Tensor], Any]
"""torchft's `Manager.allreduce`: averages a tensor in place over the live groups, returns its Work
(`wait()`); a failed exchange leaves the tensor as it was and marks the step, which the commit refuses."""


def exchange_after_backward(grads: list[torch.Tensor], allreduce: Allreduce) -> None:
    """Average `grads` across the groups once the backward pass is over, bucket after bucket; the next
    bucket is on its way while the previous one is copied back, at most two buckets' copies alive."""
    in_flight: tuple[Any, torch.Tensor, list[torch.Tensor]] | None = None
    for bucket in _buckets(grads):
        flat = torch.cat([grad.reshape(-1) for grad in bucket])
        work = allreduce(flat)
        if in_flight is not None:
            _unflatten(*in_flight)
        in_flight = (work, flat, bucket)
    if in_flight is not None:
        _unflatten(*in_flight)


BUCKET_BYTES = 256 * 2**20
"""The most gradient bytes one exchange across the groups carries (a copy of them is held meanwhile)."""


def _buckets(grads: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """The gradients in runs of one dtype and device, each at most `BUCKET_BYTES` (or one tensor)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for grad in grads:
        nbytes = grad.numel() * grad.element_size()
        kind = (grad.dtype, grad.device)
        if bucket and (size + nbytes > BUCKET_BYTES or kind != (bucket[0].dtype, bucket[0].device)):
            yield bucket
            bucket, size = [], 0
        bucket.append(grad)
        size += nbytes
    if bucket:
        yield bucket


def _unflatten(work: Any, flat: torch.Tensor, bucket: list[torch.Tensor]) -> None:
    """Wait for a bucket's exchange and copy its average back into the gradients it was made of."""
    work.wait()
    offset = 0
    for grad in bucket:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
