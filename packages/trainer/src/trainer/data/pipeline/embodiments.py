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

Statistics: the state and action statistics of each member, widened to the mixture's sizes (mean 0,
std 1 on the dims it lacks), are pooled by frame count as a mixture pools them; each camera's are
pooled over the members that have it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from trainer.config.dataset import PAD_SUFFIX, Dataset, Frames, Stats
from trainer.data.dataset import (
    ACTION_DIM_PAD_KEY,
    ACTION_KEY,
    CAMERA_MASK_SUFFIX,
    OBS_KEY,
    STATE_DIM_PAD_KEY,
    is_camera,
)
from trainer.data.pipeline.mixture import Mixture, pool_stats

PADDED = {OBS_KEY: STATE_DIM_PAD_KEY, ACTION_KEY: ACTION_DIM_PAD_KEY}


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
        counts = [len(member) for member in self.members]
        widened = [self._widened(member.stats()) for member in self.members]
        keys = list(dict.fromkeys(key for s in widened for key in s))
        pooled: Stats = {}
        for key in keys:
            having = [(s, n) for s, n in zip(widened, counts, strict=True) if key in s]
            pooled.update(pool_stats([{key: s[key]} for s, _ in having], [n for _, n in having]))
        return pooled

    def _widened(self, stats: Stats) -> Stats:
        """A member's statistics with its state and action mean/std padded to the mixture's sizes."""
        out = dict(stats)
        for key, width in ((OBS_KEY, self.obs_dim), (ACTION_KEY, self.action_dim)):
            if key in stats:
                mean, std = stats[key]["mean"], stats[key]["std"]
                extra = width - mean.shape[-1]
                out[key] = {"mean": F.pad(mean, (0, extra)), "std": F.pad(std, (0, extra), value=1.0)}
        return out
