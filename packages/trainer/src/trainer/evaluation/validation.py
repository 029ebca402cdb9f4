"""The loss on held-out episodes (`--dataset.val_episodes`), reduced across ranks like the training loss.

Every frame of the held-out set is scored once per evaluation, in a fixed order split across ranks.
Each rank runs the same number of forward passes (a sharded policy gathers its parameters with the
others on each one): a rank whose share ran out scores one frame with weight 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from trainer.config.dataset import Dataset, Frames
from trainer.data.pipeline.feed import DataFeed


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
) -> float:
    """Collective: call on all ranks. The policy's training loss averaged over every held-out frame
    (of the frames `[start, stop)` with `span`: one member of a mixture)."""
    device = accelerator.device
    start, stop = span if span is not None else (0, len(dataset))
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    for indices, weight in rank_batches(
        stop - start, accelerator.num_processes, accelerator.process_index, batch_size
    ):
        batch = preprocessor(dataset.gather(indices + start, frames))
        loss, _ = model({key: value.to(device) for key, value in batch.items()})
        totals[0] += float(loss) * len(indices) * weight
        totals[1] += len(indices) * weight
    model.train(was_training)
    totals = accelerator.reduce(totals, reduction="sum")
    return float(totals[0]) / max(float(totals[1]), 1.0)


def val_losses(
    accelerator: Any, model: Any, feed: DataFeed, preprocessor: Any, batch_size: int
) -> tuple[float, dict[str, float]]:
    """Collective: call on all ranks. The held-out loss of `feed`'s held-out data and, for a mixture,
    each member's (`val_loss/<member>`), val_loss being their mean weighted by frames."""
    held_out = feed.val_dataset
    if held_out is None:
        raise ValueError("val_losses needs held-out data (--dataset.val_episodes)")
    spans = feed.held_out_spans()
    losses = [
        held_out_loss(
            accelerator, model, held_out, preprocessor, batch_size, feed.frames, (span.start, span.stop)
        )
        for span in spans
    ]
    if len(spans) == 1 and spans[0].label is None:
        return losses[0], {}
    total = sum(value * span.frames for value, span in zip(losses, spans, strict=True))
    per_member = {f"val_loss/{span.label}": value for span, value in zip(spans, losses, strict=True)}
    return total / sum(span.frames for span in spans), per_member
