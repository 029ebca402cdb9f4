"""A mixture whose members differ (robots of other state and action sizes, cameras, frame rates),
served in one layout a policy that takes it (`PolicyConfig.takes_mixed_members`) reads.

Every item's `observation.state` and `action` are zero-padded to the widest member's sizes, with
`observation.state_dim_is_pad` / `action_dim_is_pad` (B, width) True on the padded values, so the
policy zeroes padded state values and its loss skips padded action dims (SmolVLA: no loss, exactly zero
gradient). The cameras are the union of the members' (under the mixture's names, after each member's
`rename_map`); a camera an item's member lacks is an empty slot: zero frames and
`<camera>_padding_mask` False (True where present), as SmolVLA masks its `empty_cameras`. Each member
reads its frames at its own fps: the policy's offsets are in frames, so a member's action chunk spans
`chunk / fps` seconds of its own recording and its videos are decoded at its own timestamps.

Statistics are per member, never pooled: robots whose joints mean different things must not share a
mean and a std. Each member is an `Embodiment` (its label, sizes and features) whose statistics are its
own, widened to the mixture's layout so that every padded value normalizes to itself under any mode
(mean 0, std 1, min and the low quantiles -1, max and the high ones 1; a camera it lacks gets the same
per channel). Every item carries its member's index (`embodiment`), which picks its statistics in the
preprocessor (data/pipeline/processors.py); `stats()` is the first member's, the default embodiment's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from trainer.config.dataset import PAD_SUFFIX, Dataset, Embodiment, Frames, Stats
from trainer.data.dataset import (
    ACTION_DIM_PAD_KEY,
    ACTION_KEY,
    CAMERA_MASK_SUFFIX,
    EMBODIMENT_KEY,
    OBS_KEY,
    STATE_DIM_PAD_KEY,
    is_camera,
)
from trainer.data.pipeline.mixture import Mixture

PADDED = {OBS_KEY: STATE_DIM_PAD_KEY, ACTION_KEY: ACTION_DIM_PAD_KEY}
# What a statistic is widened with, where a member lacks the value: each maps a padded value onto itself
# ((x - 0) / 1 for mean/std, 2 (x + 1) / 2 - 1 for a [-1, 1] range). Other statistics (count) are left out.
WIDENED_WITH = {
    "mean": 0.0,
    "std": 1.0,
    "min": -1.0,
    "max": 1.0,
    "q01": -1.0,
    "q99": 1.0,
    "q10": -1.0,
    "q90": 1.0,
}


class MixedMixture(Mixture):
    """`members` that may differ in state/action sizes and cameras, as one dataset; `camera_shapes`:
    (C, H, W) of every camera of any member, under the mixture's names (one shape per name)."""

    def __init__(
        self,
        members: Sequence[Dataset],
        weights: Sequence[float],
        labels: Sequence[str],
        camera_shapes: Mapping[str, tuple[int, int, int]],
    ) -> None:
        super().__init__(members, weights, labels)
        union: list[str] = []
        for member in self.members:
            union += [name for name in member.input_features if name not in union]
        self.input_features = union
        self.cameras = [name for name in union if is_camera(name)]
        self.camera_shapes = dict(camera_shapes)
        self.embodiments = [
            Embodiment(label, member.obs_dim, member.action_dim, tuple(member.input_features))
            for member, label in zip(self.members, self.labels, strict=True)
        ]

    @property
    def obs_dim(self) -> int:
        return max(member.obs_dim for member in self.members)

    @property
    def action_dim(self) -> int:
        return max(member.action_dim for member in self.members)

    def member_batch(self, k: int, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        """Member `k`'s samples padded to the mixture's layout (see the module docstring)."""
        batch = self.members[k].gather(indices, frames)
        count = len(indices)
        batch[EMBODIMENT_KEY] = torch.full((count,), k, dtype=torch.int64)
        for key, mask in PADDED.items():
            width = self.obs_dim if key == OBS_KEY else self.action_dim
            own = batch[key].shape[-1]
            batch[key] = F.pad(batch[key], (0, width - own))
            batch[mask] = (torch.arange(width) >= own).repeat(count, 1)
        history = Frames.of(frames).observation if Frames.of(frames).history else ()
        for name in self.cameras:
            present = name in batch
            batch[name + CAMERA_MASK_SUFFIX] = torch.full((count,), present)
            if not present:
                time = (len(history),) if history else ()
                batch[name] = torch.zeros((count, *time, *self.camera_shapes[name]), dtype=torch.uint8)
                if history:
                    batch[name + PAD_SUFFIX] = torch.ones((count, len(history)), dtype=torch.bool)
        return batch

    def stats(self) -> Stats:
        """The default embodiment's (the first member's) statistics: the items of the others are
        normalized by their own (`embodiment_stats`)."""
        return self.embodiment_stats()[0]

    def embodiment_stats(self) -> list[Stats]:
        """Each member's own statistics, widened to the mixture's layout (the module docstring)."""
        own = [member.stats() for member in self.members]
        keys = list(dict.fromkeys(key for stats in own for key in stats))
        widest = {
            key: max((s[key] for s in own if key in s), key=lambda e: e["mean"].shape[-1]) for key in keys
        }
        return [{key: _widened(stats.get(key), widest[key]) for key in keys} for stats in own]


def _widened(
    entry: dict[str, torch.Tensor] | None, widest: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A member's statistics of one key padded to the widest member's size along the last axis (all of
    them `WIDENED_WITH`'s values where it lacks the key)."""
    out = {}
    for name, fill in WIDENED_WITH.items():
        if name not in widest:
            continue
        target = widest[name]
        if entry is None or name not in entry:
            out[name] = torch.full_like(target, fill)
        else:
            own = entry[name].to(target.dtype)
            out[name] = F.pad(own, (0, target.shape[-1] - own.shape[-1]), value=fill)
    return out
