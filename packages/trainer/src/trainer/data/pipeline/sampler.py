"""A sample order defined globally, then split across data-parallel ranks.

Each loop step takes the next `batch_size x dp_world_size` samples of one per-epoch permutation
(seeded by (seed, epoch)) and hands rank r the r-th slice. The position is just (epoch, offset), so a
resume with the same global batch continues with exactly the samples the interrupted run would have
used, and the order does not depend on how the ranks are arranged (DDP, FSDP2 or HSDP).
"""

from __future__ import annotations

import torch

from trainer.errors import ConfigError


class GlobalOrderSampler:
    def __init__(
        self, num_samples: int, batch_size: int, dp_world_size: int, dp_rank: int, seed: int
    ) -> None:
        self.global_batch = batch_size * dp_world_size
        if self.global_batch > num_samples:
            raise ConfigError(
                f"--batch_size={batch_size} x dp_world_size={dp_world_size} = {self.global_batch} samples per "
                f"step, but the dataset has only {num_samples}: lower --batch_size or add --dataset.episodes"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, offset): samples of this epoch's permutation consumed by the whole run."""
        return self.epoch, self.offset

    def set_position(self, epoch: int, offset: int) -> None:
        """Continue from a recorded position (resume)."""
        if offset < 0 or offset > self.num_samples:
            raise ValueError(f"sampler offset {offset} is outside [0, {self.num_samples}]")
        self.epoch, self.offset = epoch, offset
        self._order = self._permutation(epoch)

    def next_indices(self) -> torch.Tensor:
        """This rank's indices for the next loop step; a short remainder starts the next epoch."""
        if self.offset + self.global_batch > self.num_samples:
            self.set_position(self.epoch + 1, 0)
        start = self.offset + self.dp_rank * self.batch_size
        self.offset += self.global_batch
        return self._order[start : start + self.batch_size]
