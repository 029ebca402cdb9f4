"""`--rename_map`: a dataset served under the observation names the policy expects.

LeRobot's flag maps a dataset's feature names to a policy's (a camera recorded as
`observation.images.top` that the policy reads as `observation.images.front`). The wrapper renames the
keys of everything the loop reads from the dataset (its feature names, each batch, the statistics the
processors are built from), so the policy, its processors and the saved config.json see only the
policy's names, while the dataset is read under its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from trainer.config.dataset import (
    PAD_SUFFIX,
    Dataset,
    DatasetConfig,
    EmbodiedDataset,
    Embodiment,
    FrameResize,
    Frames,
    Stats,
    embodiments_of,
)
from trainer.data.dataset import CAMERA_MASK_SUFFIX
from trainer.data.pipeline.view import DatasetView


def load_renamed(
    config: DatasetConfig,
    rename: Mapping[str, str],
    input_features: Sequence[str],
    *,
    held_out: bool,
    mixed_members: bool = False,
    padded: bool = True,
    resize: FrameResize | None = None,
) -> tuple[Dataset, Dataset | None, str]:
    """The data (and with `held_out` the held-out data) for a policy that reads `input_features`
    under `rename`: the dataset is asked for its own names and served under the policy's. Returns the
    note naming the renames that matched no feature the run reads ("" if none). `mixed_members`: the
    policy's `takes_mixed_members`, `padded` its `pads_mixed_members`, `resize` its `frame_resize`."""
    dataset_name = {new: old for old, new in rename.items()}
    asked = [dataset_name.get(name, name) for name in input_features]
    serving = config.serving(mixed_members, padded, resize)
    dataset = serving.load(asked)
    validation = serving.load_validation(dataset.input_features) if held_out else None
    unused = [old for old in rename if old not in dataset.input_features]
    note = (
        f"--rename_map: {', '.join(unused)} is not among the observation features this run reads "
        f"({', '.join(dataset.input_features)}): not renamed"
        if unused
        else ""
    )
    if len(unused) == len(rename):
        return dataset, validation, note
    renamed_validation = RenamedDataset(validation, rename) if validation is not None else None
    return RenamedDataset(dataset, rename), renamed_validation, note


class RenamedDataset(DatasetView):
    """`inner` with its keys renamed by `rename` (dataset name -> policy name); other keys unchanged."""

    def __init__(self, inner: Dataset, rename: Mapping[str, str]) -> None:
        super().__init__(inner)
        self.rename = dict(rename)
        self.input_features = [self.rename.get(name, name) for name in inner.input_features]
        self.vector_widths = {self.rename.get(n, n): w for n, w in inner.vector_widths.items()}
        # a mixture's robots (members that differ), their features renamed too; [] for one robot's data
        self.embodiments = [
            Embodiment(
                e.name, e.obs_dim, e.action_dim, tuple(self.rename.get(n, n) for n in e.input_features)
            )
            for e in embodiments_of(inner)
        ]

    def gather(self, indices: torch.Tensor, frames: Frames | int) -> dict[str, torch.Tensor]:
        return {self._renamed(k): v for k, v in self.inner.gather(indices, frames).items()}

    def _renamed(self, key: str) -> str:
        """A feature's new name; its `<feature>_is_pad` and `<camera>_padding_mask` masks follow it."""
        base = key.removesuffix(PAD_SUFFIX).removesuffix(CAMERA_MASK_SUFFIX)
        return self.rename.get(base, base) + key[len(base) :] if base in self.rename else key

    def stats(self) -> Stats:
        return self._renamed_stats(self.inner.stats())

    def embodiment_stats(self) -> list[Stats]:
        """Each robot's statistics under the new names ([] for one robot's data)."""
        inner = self.inner
        return (
            [self._renamed_stats(s) for s in inner.embodiment_stats()]
            if isinstance(inner, EmbodiedDataset)
            else []
        )

    def _renamed_stats(self, stats: Stats) -> Stats:
        return {self.rename.get(k, k): v for k, v in stats.items()}
