"""The loss on held-out episodes (`--dataset.val_episodes`), and the floats the policy reports beside it,
reduced across ranks like the training loss.

Every frame of the held-out set is scored once per evaluation, in a fixed order split across ranks.
Each rank runs the same number of forward passes (a sharded policy gathers its parameters with the
others on each one): a rank whose share ran out scores one frame with weight 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from trainer.config.dataset import Dataset, Frames
from trainer.data.pipeline.feed import DataFeed
from trainer.reporting.policy_metrics import scalar_metrics


@dataclass(frozen=True)
class HeldOut:
    """A held-out evaluation: the loss, each mixture member's (`val_loss/<member>`, empty for one
    dataset) and the policy's own metrics under its names, each averaged over every held-out frame."""

    loss: float
    per_member: dict[str, float]
    metrics: dict[str, float]


def rank_batches(
    num_samples: int, world: int, rank: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, float]]:
    """(indices, weight) per forward pass for this rank: its contiguous share of `range(num_samples)`
    in batches; every rank yields the same number of batches (weight 0 for a filler)."""
    per_rank = -(-num_samples // world)
    start = min(rank * per_rank, num_samples)
    mine = torch.arange(start, min(start + per_rank, num_samples))
    for i in range(-(-per_rank // batch_size)):
        chunk = mine[i * batch_size : (i + 1) * batch_size]
        yield (chunk, 1.0) if len(chunk) else (torch.zeros(1, dtype=torch.long), 0.0)


@torch.no_grad()
def held_out_loss(
    accelerator: Any,
    model: Any,
    dataset: Dataset,
    preprocessor: Any,
    batch_size: int,
    frames: Frames | int,
    span: tuple[int, int] | None = None,
) -> tuple[float, dict[str, float]]:
    """Collective: call on all ranks. The policy's training loss and its own metrics (`scalar_metrics`),
    each averaged over every held-out frame (of the frames `[start, stop)` with `span`: one member of a
    mixture), reduced over the ranks together in one collective."""
    device = accelerator.device
    start, stop = span if span is not None else (0, len(dataset))
    names: list[str] = []
    sums: list[float] = []  # the loss, then each metric, weighted by the frames scored
    counted = 0.0
    was_training = model.training
    model.eval()
    for indices, weight in rank_batches(
        stop - start, accelerator.num_processes, accelerator.process_index, batch_size
    ):
        batch = preprocessor(dataset.gather(indices + start, frames))
        loss, reported = model({key: value.to(device) for key, value in batch.items()})
        metrics = scalar_metrics(reported)
        if not sums:
            names, sums = list(metrics), [0.0] * (1 + len(metrics))
        frames_scored = len(indices) * weight
        for i, value in enumerate((loss, *(metrics[name] for name in names))):
            sums[i] += float(value) * frames_scored
        counted += frames_scored
    model.train(was_training)
    totals = torch.tensor([counted, *sums] if sums else [counted, 0.0], dtype=torch.float64, device=device)
    totals = accelerator.reduce(totals, reduction="sum")
    count = max(float(totals[0]), 1.0)
    means = [float(total) / count for total in totals[1:]]
    return means[0], dict(zip(names, means[1:], strict=True))


def val_losses(accelerator: Any, model: Any, feed: DataFeed, preprocessor: Any, batch_size: int) -> HeldOut:
    """Collective: call on all ranks. The held-out loss of `feed`'s held-out data and, for a mixture,
    each member's (`val_loss/<member>`), val_loss and the policy's metrics being their means weighted by
    frames."""
    held_out = feed.val_dataset
    if held_out is None:
        raise ValueError("val_losses needs held-out data (--dataset.val_episodes)")
    spans = feed.held_out_spans()
    results = [
        held_out_loss(
            accelerator, model, held_out, preprocessor, batch_size, feed.frames, (span.start, span.stop)
        )
        for span in spans
    ]
    if len(spans) == 1 and spans[0].label is None:
        return HeldOut(results[0][0], {}, results[0][1])
    frames = sum(span.frames for span in spans)
    loss = sum(value * span.frames for (value, _), span in zip(results, spans, strict=True)) / frames
    metrics = {
        name: sum(metrics[name] * span.frames for (_, metrics), span in zip(results, spans, strict=True))
        / frames
        for name in results[0][1]
    }
    per_member = {f"val_loss/{span.label}": value for span, (value, _) in zip(spans, results, strict=True)}
    return HeldOut(loss, per_member, metrics)
