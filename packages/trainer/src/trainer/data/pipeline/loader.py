"""The input pipeline: each step's batch of this rank's samples, decoded ahead in DataLoader workers.

The sample order stays the global-order sampler's (sampler.py): the loop's sampler advances by exactly
one step per batch it receives, so the position a checkpoint records is that of the last batch trained
on, never of a batch a worker has prefetched. The workers draw the same index lists from a copy of the
sampler taken at the start (a resumed run's copy starts at its restored position), so with or without
workers, resumed or not, step `s` trains on the same indices.

Workers run only for a dataset whose `gather` decodes (`gather_in_workers`, the camera datasets): for
in-memory arrays a worker would only add copies. A failing worker never reaches the loop as a
DataLoader traceback: its error comes back as one line, and a killed or stalled worker is noticed within
`timeout_s` (the run's --collective_timeout_s) and reported in one line, so the rank stops and its
launcher stops the others.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from trainer.config.dataset import Dataset, Frames
from trainer.data.format.decode import DecodeError
from trainer.data.pipeline.sampler import GlobalOrderSampler

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LoaderSettings:
    """How a rank's batches are produced (the run's --num_workers, --prefetch_factor,
    --persistent_workers, --dataloader_multiprocessing_context)."""

    num_workers: int = 0
    prefetch_factor: int = 2
    persistent_workers: bool = True
    """Keep the workers between iterators (the run makes one iterator, so they live for all of it)."""
    multiprocessing_context: str | None = None
    """How workers start (fork, spawn, forkserver); None: Python's platform default."""
    timeout_s: float = 300.0
    """How long a batch may take before the worker is reported stalled (--collective_timeout_s)."""
    pin_memory: bool = False
    """Page-locked batches for a fast, asynchronous copy to a CUDA device."""


@dataclass(frozen=True)
class Failure:
    """A worker's error, returned instead of raised so the loop sees the line, not a traceback."""

    line: str


class _Gather(torch.utils.data.Dataset):
    """The DataLoader's view of a dataset: item `indices` is the whole batch `gather(indices)`."""

    def __init__(self, dataset: Dataset, frames: Frames) -> None:
        self.dataset = dataset
        self.frames = frames

    def __getitem__(self, indices: torch.Tensor) -> Batch | Failure:
        try:
            return self.dataset.gather(indices, self.frames)
        except Exception as exc:  # one line, whatever the cause: the loop raises it on this rank
            return Failure(" ".join(str(exc).split()) or type(exc).__name__)


class _Draws:
    """The index lists of the next `steps` loop steps, drawn from a copy of the loop's sampler."""

    def __init__(self, sampler: GlobalOrderSampler, steps: int) -> None:
        self.sampler = copy.deepcopy(sampler)
        self.steps = steps

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.steps):
            yield self.sampler.next_indices()


def batches(
    dataset: Dataset,
    sampler: GlobalOrderSampler,
    steps: range,
    frames: Frames,
    settings: LoaderSettings,
    device: torch.device | None = None,
    augment: Callable[[Batch, int], Batch] | None = None,
) -> Iterator[Batch]:
    """This rank's batch for each loop step in `steps`, in the sampler's order, on `device` and
    augmented for its step; the sampler's position moves with each batch handed out (see the module
    docstring)."""
    device = device or torch.device("cpu")
    for step, batch in zip(steps, _gathered(dataset, sampler, len(steps), frames, settings), strict=True):
        batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
        yield batch if augment is None else augment(batch, step)


def _gathered(
    dataset: Dataset, sampler: GlobalOrderSampler, steps: int, frames: Frames, settings: LoaderSettings
) -> Iterator[Batch]:
    if settings.num_workers == 0 or not dataset.gather_in_workers:
        for _ in range(steps):
            yield dataset.gather(sampler.next_indices(), frames)
        return
    loader = torch.utils.data.DataLoader(
        _Gather(dataset, frames),
        batch_size=None,
        sampler=_Draws(sampler, steps),
        num_workers=settings.num_workers,
        prefetch_factor=settings.prefetch_factor,
        persistent_workers=settings.persistent_workers,
        multiprocessing_context=settings.multiprocessing_context,
        pin_memory=settings.pin_memory,
        timeout=settings.timeout_s,
        # The workers' base seed comes from a generator of their own: drawn from the global one, it
        # would shift the training RNG (dropout, the CVAE's noise) by one draw at the iterator's start,
        # which a resumed run makes at another step than the uninterrupted one.
        generator=torch.Generator().manual_seed(0),
    )
    stream = iter(loader)
    _no_async_worker_errors(stream)
    for _ in range(steps):
        sampler.next_indices()  # the recorded position follows the batches trained on
        yield _received(stream, settings)


def _no_async_worker_errors(stream: Any) -> None:
    """torch reports a dead worker from its SIGCHLD handler, as a RuntimeError raised wherever the main
    thread is (inside the policy's forward: a traceback no one can map). Unregistering the workers from
    that handler leaves the report to `next()`, which notices a dead or stalled worker within the
    DataLoader's `timeout` and is mapped to one line in `_received`. The test suite pins these torch
    internals (tests/training/test_cameras.py)."""
    from torch.utils.data._utils import signal_handling

    if stream._worker_pids_set:
        signal_handling._remove_worker_pids(id(stream))
        stream._worker_pids_set = False


def _received(stream: Iterator[Any], settings: LoaderSettings) -> Batch:
    try:
        batch = next(stream)
    except Exception as exc:  # a worker died (killed, out of memory) or timed out; its half-sent batch
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]  # can fail to unpickle
        raise DecodeError(
            f"a data loader worker stopped delivering batches within {settings.timeout_s:g} s ({detail}); check "
            f"the machine's memory, or lower --num_workers={settings.num_workers} (0 decodes in the training "
            "process)"
        ) from None
    if isinstance(batch, Failure):
        raise DecodeError(batch.line)
    return batch
