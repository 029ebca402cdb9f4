"""The data feed: everything the training loop does with data, behind one object.

The loop asks the feed for its batches and, when it logs, for the data's metrics; validation asks it
for the held-out spans. Behind it: the global-order sampler (sampler.py; weighted for a mixture), the
input pipeline that decodes ahead in workers (loader.py), the per-member tally of a mixture's samples,
and the streaming layer's retry count (data/format/remote.py). The sampler is the feed's own, and its
position is what a checkpoint records and a resume restores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from trainer.config.dataset import Dataset, Frames
from trainer.config.sections import DataSection
from trainer.data.format import remote
from trainer.data.pipeline import loader
from trainer.data.pipeline.sampler import GlobalOrderSampler, MemberTally, sampled_frames

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class HeldOutSpan:
    """Frames `[start, stop)` of the held-out data: all of it, or one mixture member (`label`)."""

    label: str | None
    start: int
    stop: int

    @property
    def frames(self) -> int:
        return self.stop - self.start


class DataFeed:
    """This rank's view of the run's data, in the global sample order."""

    def __init__(
        self,
        section: DataSection,
        dataset: Dataset,
        val_dataset: Dataset | None,
        frames: Frames,
        *,
        dp_world_size: int,
        rank: int,
        device: torch.device,
        drop_last_frames: int = 0,
    ) -> None:
        """`drop_last_frames`: the policy's `drop_n_last_frames`, the frames at the end of each episode
        never sampled (they still serve as other samples' observations and actions)."""
        self.section, self.dataset, self.val_dataset = section, dataset, val_dataset
        self.frames, self.rank, self.device = frames, rank, device
        weighted = dataset.weighted_order
        kept = sampled_frames(dataset.episode_bounds(), drop_last_frames) if drop_last_frames else None
        self.sampler = GlobalOrderSampler(
            len(dataset), section.batch_size, dp_world_size, rank, section.seed, weighted=weighted, kept=kept
        )
        self._tally = MemberTally(weighted) if weighted is not None else None
        self._waited_s = 0.0

    def batches(self, steps: range) -> Iterator[Batch]:
        """This rank's batch for each loop step in `steps`, on the device, augmented when the data says
        so; the cameras arrive as uint8 (or augmented floats) for the preprocessor to normalize."""
        section = self.section
        settings = loader.LoaderSettings(
            section.num_workers,
            section.prefetch_factor,
            section.persistent_workers,
            section.multiprocessing_context,
            section.timeout_s,
            pin_memory=self.device.type == "cuda",
        )
        augment = section.dataset.augmentation(section.seed, self.rank)
        stream = loader.batches(
            self.dataset, self.sampler, steps, self.frames, settings, self.device, augment
        )
        while True:
            started = time.perf_counter()
            batch = next(stream, None)
            self._waited_s += time.perf_counter() - started
            if batch is None:
                return
            if self._tally is not None:
                self._tally.add(self.sampler.last_global)
            yield batch

    def metrics(self) -> dict[str, float | int]:
        """The data's share of a log line, since the last call: a mixture's samples per member (the
        whole step's, every rank's: `samples/<member>`), a streamed dataset's retried GETs so far
        (`stream_retries`, this rank's), and the seconds this rank waited for its batches
        (`data_wait_s`)."""
        found: dict[str, float | int] = dict(self._tally.take()) if self._tally is not None else {}
        retries = remote.retry_count()
        if retries is not None:
            found["stream_retries"] = retries
        found["data_wait_s"], self._waited_s = self._waited_s, 0.0
        return found

    def held_out_spans(self) -> list[HeldOutSpan]:
        """The held-out data val_loss scores, as spans of `val_dataset`: one per mixture member, or one
        for all of it; empty without held-out data. With --max_eval_samples each span keeps its first
        frames, the cap split evenly across the spans (at least one frame each)."""
        held_out = self.val_dataset
        if held_out is None:
            return []
        weighted = held_out.weighted_order
        if weighted is None:
            spans = [HeldOutSpan(None, 0, len(held_out))]
        else:
            spans = [
                HeldOutSpan(label, int(start), int(start + size))
                for label, start, size in zip(weighted.labels, weighted.starts, weighted.sizes, strict=True)
            ]
        cap = self.section.max_val_samples
        if not cap:
            return spans
        each = max(1, cap // len(spans))
        return [HeldOutSpan(s.label, s.start, min(s.stop, s.start + each)) for s in spans]
