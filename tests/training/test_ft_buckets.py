"""The gradients a replica group exchanges across groups travel in flat buckets
(trainer.distributed.gradient_buckets): runs of one dtype and device, bounded in size, each averaged
tensor copied back where it came from; in a group of one process each bucket is sent during the
backward pass that ends a window, as soon as its gradients are ready, in the same order every time."""

from __future__ import annotations

import torch

from trainer.distributed.gradient_buckets import OverlappedExchange, _buckets, _unflatten


class _Done:
    """A finished exchange (torchft's Work, as `_unflatten` uses it)."""

    def wait(self) -> None:
        pass


def test_buckets_split_at_a_dtype_change_and_close_at_the_size_bound() -> None:
    f64 = torch.float64
    grads = [
        torch.zeros(4),
        torch.zeros(2, dtype=f64),
        torch.zeros(8),
        torch.zeros(8),
        torch.zeros(3),
        torch.zeros(40),
        torch.zeros(1),
    ]
    sizes = [[(g.numel(), g.dtype) for g in bucket] for bucket in _buckets(grads, 64)]
    assert sizes == [
        [(4, torch.float32)],
        [(2, f64)],  # another dtype, though it would fit
        [(8, torch.float32), (8, torch.float32)],  # 64 bytes: closed
        [(3, torch.float32), (40, torch.float32)],  # the one that crosses the bound rides along
        [(1, torch.float32)],
    ]


def test_an_exchanged_bucket_lands_back_in_each_gradient() -> None:
    grads = [torch.arange(6.0).reshape(2, 3), torch.tensor([10.0, 20.0]), torch.ones(1, 1, 2)]
    expected = [2 * g for g in grads]
    (bucket,) = list(_buckets(grads, 2**20))
    flat = torch.cat([g.reshape(-1) for g in bucket]) * 2  # what the exchange leaves in the flat copy
    _unflatten(_Done(), flat, bucket)
    for grad, want in zip(grads, expected, strict=True):
        assert torch.equal(grad, want)


class _Peer:
    """The exchange with one peer group whose gradients are three times ours: the average, twice ours,
    lands in the flat copy only when the exchange is waited for (as torchft's does, asynchronously).
    Records, at each send, whether the backward pass had reached the first layer yet."""

    def __init__(self, model: torch.nn.Sequential) -> None:
        self.model = model
        self.sent: list[tuple[int, bool]] = []

    def allreduce(self, flat: torch.Tensor) -> _Deferred:
        self.sent.append((flat.numel(), self.model[0].weight.grad is not None))
        return _Deferred(flat)


class _Deferred:
    def __init__(self, flat: torch.Tensor) -> None:
        self.flat = flat

    def wait(self) -> None:
        self.flat.mul_(2)


def _three_layers() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))


def _gradients(
    model: torch.nn.Module, inputs: list[torch.Tensor], skip: int | None = None
) -> list[torch.Tensor | None]:
    """The gradients of the summed outputs after one backward pass per input (layer `skip` unused)."""
    for x in inputs:
        for index, layer in enumerate(model):
            x = x if index == skip else layer(x)
        x.sum().backward()
    return [None if param.grad is None else param.grad.clone() for param in model.parameters()]


def _doubled(grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    return [None if grad is None else 2 * grad for grad in grads]


def _equal(model: torch.nn.Module, expected: list[torch.Tensor | None]) -> bool:
    pairs = zip([param.grad for param in model.parameters()], expected, strict=True)
    return all(got is want is None or torch.equal(got, want) for got, want in pairs)


LAYER_BYTES = (4 * 4 + 4) * 4  # a 4 x 4 layer's weight and bias: one bucket each


def test_an_armed_backward_sends_each_bucket_as_the_backward_reaches_it() -> None:
    inputs = [torch.randn(3, 4)]
    expected = _doubled(_gradients(_three_layers(), inputs))
    model = _three_layers()
    peer = _Peer(model)
    exchange = OverlappedExchange(model, peer.allreduce, LAYER_BYTES)
    exchange.arm()
    _gradients(model, inputs)
    # the last layer's and the middle one's buckets went before the backward reached the first layer
    assert peer.sent == [(20, False), (20, False), (20, True)]
    exchange.finish()
    assert _equal(model, expected)  # bit for bit: the average, copied back in place


def test_a_micro_batch_inside_the_window_sends_nothing_the_last_sends_the_sum() -> None:
    inputs = [torch.randn(3, 4), torch.randn(3, 4)]
    expected = _doubled(_gradients(_three_layers(), inputs))
    model = _three_layers()
    peer = _Peer(model)
    exchange = OverlappedExchange(model, peer.allreduce, LAYER_BYTES)
    _gradients(model, inputs[:1])
    assert peer.sent == []
    exchange.arm()
    _gradients(model, inputs[1:])
    exchange.finish()
    assert len(peer.sent) == 3 and _equal(model, expected)
    _gradients(model, inputs[:1])  # finished: the next window's first micro-batch sends nothing
    assert len(peer.sent) == 3


def test_a_bucket_without_its_gradients_waits_and_keeps_the_order_until_finish() -> None:
    inputs = [torch.randn(3, 4)]
    expected = _doubled(_gradients(_three_layers(), inputs, skip=1))
    model = _three_layers()
    peer = _Peer(model)
    exchange = OverlappedExchange(model, peer.allreduce, LAYER_BYTES)
    exchange.arm()
    _gradients(model, inputs, skip=1)  # the middle layer (bucket 1) gets no gradient
    assert peer.sent == [(20, False)]  # the first layer's bucket waits behind the middle one's
    exchange.finish()
    assert peer.sent == [(20, False), (20, True)]  # the middle one held nothing to send
    assert _equal(model, expected) and model[1].weight.grad is None
