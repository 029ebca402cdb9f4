"""The gradients a replica group averages with the other live groups (distributed/fault_tolerance.py)
travel in flat buckets: runs of one dtype and device, bounded in size, so that a few exchanges carry
them rather than one per parameter (each of torchft's exchanges has a fixed cost: a future, its
timeout, a callback). The average of a flat bucket is the per-tensor one, element for element, and
each averaged tensor is copied back where it came from.

Two ways to run the exchange, the same average either way:
- `OverlappedExchange`, as DDP does: on the backward pass that ends an accumulation window, each bucket
  is sent as soon as the backward has produced its gradients (the parameters in reverse order, the
  order the backward produces them), so the exchange runs beside the rest of the backward and only the
  last bucket's exchange follows it. For a group of one process holding whole tensors: a gradient is final
  once accumulated.
- `exchange_after_backward`, for FSDP2 groups: a rank's gradient shard is final only after the group's
  own reduce-scatter, so the exchange follows the backward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch

Allreduce = Callable[[torch.Tensor], Any]
"""torchft's `Manager.allreduce`: averages a tensor in place over the live groups, returns its Work
(`wait()`); a failed exchange leaves the tensor as it was and marks the step, which the commit refuses."""


OVERLAPPED_BUCKET_BYTES = 4 * 2**20
"""The bucket bound of the overlapped exchange: small enough that the last bucket, the one whose
exchange follows the backward pass, is a small part of the gradients; large enough that the exchanges'
fixed cost stays small (see docs/fault_tolerance.md, "Measured")."""


class OverlappedExchange:
    """The exchange of a model's gradients sent during the backward pass that ends a window: `arm()`
    before that backward pass, `finish()` after it. A hook on each trained parameter counts its
    gradient ready; a bucket is sent once all of its gradients are ready and every bucket before it was
    sent, so every group sends the same buckets in the same order. A backward pass that was not armed
    (a micro-batch inside a window) sends nothing. The buckets in flight hold a copy of the gradients,
    as DDP's do."""

    def __init__(self, model: torch.nn.Module, allreduce: Allreduce, bucket_bytes: int) -> None:
        trained = [param for param in model.parameters() if param.requires_grad]
        self._buckets = list(_buckets(trained[::-1], bucket_bytes))
        self._allreduce = allreduce
        self._armed = False
        self._ready = [0] * len(self._buckets)
        self._sent = 0
        self._in_flight: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []
        for index, bucket in enumerate(self._buckets):
            for param in bucket:
                param.register_post_accumulate_grad_hook(partial(self._gradient_ready, index))

    def arm(self) -> None:
        """Before the backward pass that ends a window: send each bucket once its gradients are ready."""
        self._armed, self._ready, self._sent = True, [0] * len(self._buckets), 0

    def finish(self) -> None:
        """After that backward pass: send the buckets still waiting (the last one; any holding a
        parameter that had no gradient this time), wait for every bucket and copy its average back."""
        while self._sent < len(self._buckets):
            self._send_next()
        self._armed = False
        in_flight, self._in_flight = self._in_flight, []
        for entry in in_flight:
            _unflatten(*entry)

    def _gradient_ready(self, index: int, param: torch.Tensor) -> None:
        """The hook: `param`'s gradient (in bucket `index`) is accumulated for this backward pass."""
        if not self._armed:
            return
        self._ready[index] += 1
        while self._sent < len(self._buckets) and self._ready[self._sent] == len(self._buckets[self._sent]):
            self._send_next()

    def _send_next(self) -> None:
        """Send the next bucket in order: the gradients its parameters hold."""
        grads = [param.grad for param in self._buckets[self._sent] if param.grad is not None]
        self._sent += 1
        if grads:
            self._in_flight.append(_send(grads, self._allreduce))


def exchange_after_backward(grads: list[torch.Tensor], allreduce: Allreduce) -> None:
    """Average `grads` across the groups once the backward pass is over, bucket after bucket; the next
    bucket is on its way while the previous one is copied back, at most two buckets' copies alive."""
    in_flight: tuple[Any, torch.Tensor, list[torch.Tensor]] | None = None
    for bucket in _buckets(grads, BUCKET_BYTES):
        sent = _send(bucket, allreduce)
        if in_flight is not None:
            _unflatten(*in_flight)
        in_flight = sent
    if in_flight is not None:
        _unflatten(*in_flight)


BUCKET_BYTES = 256 * 2**20
"""The bucket bound of the exchange after the backward pass (a copy of two buckets is held meanwhile):
few exchanges for the large sharded models FSDP2 groups train."""


def _buckets(tensors: Sequence[torch.Tensor], bound: int) -> Iterator[list[torch.Tensor]]:
    """The tensors (gradients, or the parameters they belong to) in runs of one dtype and device, each
    closed once it holds `bound` bytes or more, as DDP closes its buckets: the tensor that crosses the
    bound rides along, so a bias does not travel alone after its weight filled a bucket."""
    bucket: list[torch.Tensor] = []
    size = 0
    for tensor in tensors:
        if bucket and (tensor.dtype, tensor.device) != (bucket[0].dtype, bucket[0].device):
            yield bucket
            bucket, size = [], 0
        bucket.append(tensor)
        size += tensor.numel() * tensor.element_size()
        if size >= bound:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def _send(grads: list[torch.Tensor], allreduce: Allreduce) -> tuple[Any, torch.Tensor, list[torch.Tensor]]:
    """Start a bucket's exchange: its gradients flattened into one copy, averaged in place. Returns what
    `_unflatten` takes: the exchange's Work, the copy and the gradients it was made of."""
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    return allreduce(flat), flat, grads


def _unflatten(work: Any, flat: torch.Tensor, bucket: list[torch.Tensor]) -> None:
    """Wait for a bucket's exchange and copy its average back into the gradients it was made of."""
    work.wait()
    offset = 0
    for grad in bucket:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
