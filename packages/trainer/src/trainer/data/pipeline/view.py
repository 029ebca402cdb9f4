"""A dataset seen through a change of its batches (`--rename_map`'s names: renamed.py; a mixture's
frames brought to one size: resized.py): one base that passes on what the change leaves alone (the
sizes, the episodes, the tasks, the sampler's hints and the banner's notes), so each wrapper states
only what it changes and a member added to the `Dataset` protocol is passed on in one place.
"""

from __future__ import annotations

import torch

from trainer.config.dataset import Dataset, Frames, Stats


class DatasetView:
    """`inner` as it is; subclasses change `gather` and whatever else their change reaches."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner
        self.input_features = list(inner.input_features)
        self.vector_widths = dict(inner.vector_widths)
        # decoding datasets (cameras) gather in the loader's workers; the wrapper pickles with them
        self.gather_in_workers = inner.gather_in_workers
        # a mixture's draw order by weight (data/pipeline/mixture.py), which the sampler follows
        self.weighted_order = inner.weighted_order
        self.notes: list[str] = list(getattr(inner, "notes", []))  # the banner's lines about the data

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def obs_dim(self) -> int:
        return self.inner.obs_dim

    @property
    def action_dim(self) -> int:
        return self.inner.action_dim

    def gather(self, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        return self.inner.gather(indices, frames)

    def stats(self) -> Stats:
        return self.inner.stats()

    def episode_bounds(self) -> torch.Tensor:
        return self.inner.episode_bounds()

    def distinct_tasks(self) -> list[str]:
        return self.inner.distinct_tasks()
