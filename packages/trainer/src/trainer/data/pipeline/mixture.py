"""A weighted mixture of datasets served as one: the members' frames one after another, each batch
gathered from the members its indices fall in, the normalization statistics pooled.

The mixture is a `Dataset` like any other, so the loop, validation and the loader need nothing new: the
order in which its frames are drawn, by weight, is the sampler's (`weighted_order`, used by
`GlobalOrderSampler`); the members are checked to agree (features, sizes) by the source that builds them
(data/sources/mixture.py).

Statistics are pooled exactly from the members' own, weighted by the frames each contributes: the
pooled mean is the frame-weighted mean of the means and the pooled variance adds each member's spread
around the pooled mean, `sum(n_k (std_k^2 + (mean_k - mean)^2)) / sum(n_k)`, which is the population
variance of the concatenated frames. `min` and `max` pool exactly too (elementwise min and max), and
`count` sums. Quantiles cannot be pooled exactly from the members' quantiles: q01 and q99 (pi0.5's
QUANTILES bounds) are their frame-weighted mean, as LeRobot aggregates them. A key the members do not
all have, or a statistic other than these, is left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.config.dataset import Dataset, Frames, Stats
from trainer.data.dataset import TASK_KEY, cat_task_bytes
from trainer.data.pipeline.sampler import WeightedOrder

POOLED = ("mean", "std", "min", "max", "q01", "q99", "count")


class Mixture:
    """`members` (which agree on features and sizes) as one dataset of all their frames, drawn by
    `weights` (positive, normalized) through `weighted_order`."""

    def __init__(self, members: Sequence[Dataset], weights: Sequence[float], labels: Sequence[str]) -> None:
        self.members = list(members)
        self.labels = list(labels)
        self.input_features = list(self.members[0].input_features)
        self.vector_widths = dict(self.members[0].vector_widths)  # members agree on their features
        self.gather_in_workers = any(m.gather_in_workers for m in self.members)
        self.weighted_order = WeightedOrder([len(m) for m in self.members], weights, labels)
        # each member's banner lines (episodes skipped, floored std), named by member
        self.notes = [
            f"{label}: {note}"
            for m, label in zip(self.members, self.labels, strict=True)
            for note in getattr(m, "notes", [])
        ]

    def __len__(self) -> int:
        return self.weighted_order.length

    @property
    def obs_dim(self) -> int:
        return self.members[0].obs_dim

    @property
    def action_dim(self) -> int:
        return self.members[0].action_dim

    def gather(self, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        """Each index's sample from its member, in the order of `indices`."""
        member = self.weighted_order.member_of(indices)
        parts, positions = [], []
        for k in torch.unique(member).tolist():
            chosen = torch.nonzero(member == k).reshape(-1)
            local = indices[chosen] - self.weighted_order.starts[k]
            parts.append(self.member_batch(k, local, frames))
            positions.append(chosen)
        if len(parts) == 1:
            return parts[0]
        where = torch.argsort(torch.cat(positions))  # from the members' order back to `indices`'
        cat = {TASK_KEY: cat_task_bytes}  # texts of different lengths; everything else one shape
        return {key: cat.get(key, torch.cat)([part[key] for part in parts])[where] for key in parts[0]}

    def member_batch(self, k: int, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        """Member `k`'s samples at its own `indices`, as the mixture serves them (a mixture of members
        that differ pads them: embodiments.py)."""
        return self.members[k].gather(indices, frames)

    def stats(self) -> Stats:
        return pool_stats([m.stats() for m in self.members], [len(m) for m in self.members])

    def episode_bounds(self) -> torch.Tensor:
        starts = self.weighted_order.starts
        return torch.cat([m.episode_bounds() + starts[k] for k, m in enumerate(self.members)])

    def distinct_tasks(self) -> list[str]:
        return list(dict.fromkeys(task for m in self.members for task in m.distinct_tasks()))


def pool_stats(stats: Sequence[Stats], frames: Sequence[int]) -> Stats:
    """The statistics of the members' frames taken together (see the module docstring), for every key
    all members have; computed in float64, returned in the members' dtype."""
    weights = torch.tensor([float(n) for n in frames], dtype=torch.float64)
    share = weights / weights.sum()
    keys = [key for key in stats[0] if all(key in s for s in stats)]
    pooled: Stats = {}
    for key in keys:
        entries = [s[key] for s in stats]
        names = [n for n in POOLED if all(n in e for e in entries)]
        pooled[key] = {}
        if "mean" in names:
            means = torch.stack([e["mean"].double() for e in entries])
            fraction = share.reshape(-1, *([1] * (means.ndim - 1)))
            mean = (fraction * means).sum(0)
            pooled[key]["mean"] = mean.to(entries[0]["mean"].dtype)
            if "std" in names:
                stds = torch.stack([e["std"].double() for e in entries])
                variance = (fraction * (stds**2 + (means - mean) ** 2)).sum(0)
                pooled[key]["std"] = variance.sqrt().to(entries[0]["std"].dtype)
        for name in ("q01", "q99"):  # LeRobot's aggregate: the frame-weighted mean of the members'
            if name in names:
                values = torch.stack([e[name].double() for e in entries])
                fraction = share.reshape(-1, *([1] * (values.ndim - 1)))
                pooled[key][name] = (fraction * values).sum(0).to(entries[0][name].dtype)
        for name, reduce in (("min", torch.amin), ("max", torch.amax), ("count", torch.sum)):
            if name in names:
                pooled[key][name] = reduce(torch.stack([e[name] for e in entries]), 0)
    return pooled
