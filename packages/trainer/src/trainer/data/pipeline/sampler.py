"""A sample order defined globally, then split across data-parallel ranks.

Each loop step takes the next `batch_size x dp_world_size` samples of one per-epoch order (seeded by
(seed, epoch)) and hands rank r the r-th slice. The position is just (epoch, offset), so a resume with
the same global batch continues with exactly the samples the interrupted run would have used, and the
order does not depend on how the ranks are arranged (DDP, FSDP2 or HSDP).

The order of an epoch is a permutation of the dataset, or, for a weighted mixture of datasets
(`WeightedOrder`), a function of (seed, epoch) too: each member's share of the epoch's positions is
fixed by its weight, the positions are shuffled, and each member's turns walk through its own
permutations. Either way the epoch's order is known to every rank without a collective, so each rank
can also count how many samples of every member the whole step drew (`MemberTally`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.config.dataset import MixtureOrder
from trainer.errors import ConfigError

SEED_STRIDE = 1_000_003  # (seed, epoch) -> one generator seed


class WeightedOrder:
    """The epoch order of a mixture: `sizes[k]` frames of member k lie at global indices
    `[starts[k], starts[k] + sizes[k])`, and member k fills `weights[k]` (normalized) of each epoch's
    `sum(sizes)` positions, its largest-remainder share, walking through fresh permutations of its
    frames as often as its share needs (a member weighted above its size is oversampled, one below it
    is seen partly each epoch, a different part every epoch)."""

    def __init__(self, sizes: Sequence[int], weights: Sequence[float], labels: Sequence[str]) -> None:
        self.sizes = torch.tensor(list(sizes), dtype=torch.int64)
        total_weight = float(sum(weights))
        self.weights = [float(w) / total_weight for w in weights]
        self.labels = list(labels)
        self.starts = torch.cumsum(self.sizes, 0) - self.sizes
        self.length = int(self.sizes.sum())
        self.shares = _largest_remainder(self.weights, self.length)

    def order(self, seed: int, epoch: int) -> torch.Tensor:
        """Global indices of epoch `epoch`'s `length` positions."""
        generator = torch.Generator().manual_seed(seed * SEED_STRIDE + epoch)
        member = torch.repeat_interleave(torch.arange(len(self.shares)), torch.tensor(self.shares))
        member = member[torch.randperm(self.length, generator=generator)]
        order = torch.empty(self.length, dtype=torch.int64)
        for k, share in enumerate(self.shares):
            size = int(self.sizes[k])
            walks = [torch.randperm(size, generator=generator) for _ in range(-(-share // size))]
            local = torch.cat(walks)[:share] if walks else torch.zeros(0, dtype=torch.int64)
            order[member == k] = local + self.starts[k]
        return order

    def member_of(self, indices: torch.Tensor) -> torch.Tensor:
        """The member each global index belongs to."""
        return torch.searchsorted(self.starts, indices, right=True) - 1

    def counts(self, indices: torch.Tensor) -> torch.Tensor:
        """Samples of each member among `indices`."""
        return torch.bincount(self.member_of(indices), minlength=len(self.labels))


def _largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """`total` split in proportion to `weights` (summing to 1), each share rounded down and the rest
    handed out by largest remainder (ties to the earlier member): exact, and the same on every rank."""
    exact = [w * total for w in weights]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda k: (-(exact[k] - shares[k]), k))
    for k in by_remainder[: total - sum(shares)]:
        shares[k] += 1
    return shares


def sampled_frames(bounds: torch.Tensor, drop_last: int) -> torch.Tensor:
    """The frames a run samples when the last `drop_last` of every `[start, end)` episode in `bounds`
    are never drawn (LeRobot's `EpisodeAwareSampler`): `[start, end - drop_last)` of each, in order; an
    episode of `drop_last` frames or fewer gives none."""
    ranges = [torch.arange(start, max(start, end - drop_last)) for start, end in bounds.tolist()]
    return torch.cat(ranges) if ranges else torch.zeros(0, dtype=torch.int64)


class GlobalOrderSampler:
    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        dp_world_size: int,
        dp_rank: int,
        seed: int,
        weighted: MixtureOrder | None = None,
        kept: torch.Tensor | None = None,
    ) -> None:
        """`kept`: the only indices drawn (`sampled_frames`), in place of all `num_samples`: an epoch
        is then a permutation of them (a mixture's weighted order with the others left out)."""
        self.global_batch = batch_size * dp_world_size
        drawn = num_samples if kept is None else len(kept)
        if self.global_batch > drawn:
            raise ConfigError(
                f"--batch_size={batch_size} x dp_world_size={dp_world_size} = {self.global_batch} samples per "
                f"step, but the dataset has only {drawn}"
                + ("" if kept is None else f" to sample (of {num_samples}: --policy.drop_n_last_frames)")
                + ": lower --batch_size or add --dataset.episodes"
            )
        if weighted is not None and weighted.length != num_samples:
            raise ValueError(f"a mixture order of {weighted.length} samples for a dataset of {num_samples}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.seed = seed
        self.weighted = weighted
        self.kept = kept
        self._kept_mask = None
        if kept is not None:
            self._kept_mask = torch.zeros(num_samples, dtype=torch.bool)
            self._kept_mask[kept] = True
        self.epoch = 0
        self.offset = 0
        self.last_global = torch.zeros(0, dtype=torch.int64)
        """The whole step's indices (every rank's) of the last `next_indices` call."""
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self.weighted is not None:
            order = self.weighted.order(self.seed, epoch)
            return order if self._kept_mask is None else order[self._kept_mask[order]]
        generator = torch.Generator().manual_seed(self.seed * SEED_STRIDE + epoch)
        if self.kept is None:
            return torch.randperm(self.num_samples, generator=generator)
        return self.kept[torch.randperm(len(self.kept), generator=generator)]

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, offset): samples of this epoch's permutation consumed by the whole run."""
        return self.epoch, self.offset

    def set_position(self, epoch: int, offset: int) -> None:
        """Continue from a recorded position (resume)."""
        order = self._permutation(epoch)
        if offset < 0 or offset > len(order):
            raise ValueError(f"sampler offset {offset} is outside [0, {len(order)}]")
        self.epoch, self.offset = epoch, offset
        self._order = order

    def next_indices(self) -> torch.Tensor:
        """This rank's indices for the next loop step; a short remainder starts the next epoch."""
        if self.offset + self.global_batch > len(self._order):
            self.set_position(self.epoch + 1, 0)
        self.last_global = self._order[self.offset : self.offset + self.global_batch]
        start = self.offset + self.dp_rank * self.batch_size
        self.offset += self.global_batch
        return self._order[start : start + self.batch_size]


class MemberTally:
    """Samples of each mixture member drawn by the whole run (every rank) since the last `take`."""

    def __init__(self, weighted: MixtureOrder) -> None:
        self.weighted = weighted
        self.counts = torch.zeros(len(weighted.labels), dtype=torch.int64)

    def add(self, global_indices: torch.Tensor) -> None:
        self.counts += self.weighted.counts(global_indices)

    def take(self) -> dict[str, int]:
        """`samples/<member>` -> count since the last take (the metrics of a log line)."""
        taken = {
            f"samples/{label}": int(n) for label, n in zip(self.weighted.labels, self.counts, strict=True)
        }
        self.counts.zero_()
        return taken
