"""The gradients a replica group exchanges across groups travel in flat buckets
(trainer.distributed.gradient_buckets): runs of one dtype and device, bounded in size, each averaged
tensor copied back where it came from."""

from __future__ import annotations

import pytest
import torch

from trainer.distributed import gradient_buckets
from trainer.distributed.gradient_buckets import _buckets, _unflatten


class _Done:
    """A finished exchange (torchft's Work, as `_unflatten` uses it)."""

    def wait(self) -> None:
        pass


def test_buckets_split_at_a_dtype_change_and_at_the_size_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gradient_buckets, "BUCKET_BYTES", 64)
    f64 = torch.float64
    grads = [
        torch.zeros(4),
        torch.zeros(2, dtype=f64),
        torch.zeros(8),
        torch.zeros(8),
        torch.zeros(40),
        torch.zeros(3),
    ]
    sizes = [[(g.numel(), g.dtype) for g in bucket] for bucket in _buckets(grads)]
    assert sizes == [
        [(4, torch.float32)],
        [(2, f64)],  # another dtype, though it would fit
        [(8, torch.float32), (8, torch.float32)],  # 64 bytes: full
        [(40, torch.float32)],  # alone over the bound: a bucket of its own
        [(3, torch.float32)],
    ]


def test_an_exchanged_bucket_lands_back_in_each_gradient() -> None:
    grads = [torch.arange(6.0).reshape(2, 3), torch.tensor([10.0, 20.0]), torch.ones(1, 1, 2)]
    expected = [2 * g for g in grads]
    (bucket,) = list(_buckets(grads))
    flat = torch.cat([g.reshape(-1) for g in bucket]) * 2  # what the exchange leaves in the flat copy
    _unflatten(_Done(), flat, bucket)
    for grad, want in zip(grads, expected, strict=True):
        assert torch.equal(grad, want)
