"""A metadata-only description of a checkpoint: what `ckpt inspect` prints and `--json` returns.

Everything here comes from JSON files, safetensors headers and DCP `.metadata`; no tensor byte is read
and torch is never imported, so describing a 100 GB checkpoint takes as long as describing a tiny one.
`verify` and `diff` reuse the same discovery of which stored tensor groups a checkpoint has.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tools.catalog import (
    DCP,
    LEROBOT,
    MODEL,
    OPTIMIZER,
    OURS,
    SAFETENSORS,
    SHARDED_SAFETENSORS,
    WeightSet,
    catalog,
    weights_for_report,
)
from ckpt_tools.dcp.index import DcpIndex, read_dcp_index
from ckpt_tools.dcp.roles import model_tensors, optimizer_tensors
from ckpt_tools.errors import NotACheckpointError
from ckpt_tools.files import locate, storage
from ckpt_tools.files.safetensors_io import SafetensorsHeader, read_safetensors_header
from ckpt_tools.files.sharded_safetensors import read_weight_map
from ckpt_tools.format import layout
from ckpt_tools.format.meta import LeRobotStep, TrainingStep


@dataclass(frozen=True)
class TensorSummary:
    """One stored tensor as its metadata describes it (the full, unsharded shape)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class TensorGroup:
    """The tensors of one stored component (model, adapter, optimizer) in one format.

    `path` is the file or directory holding them: a `.safetensors` file, a sharded index, or a DCP
    directory. `objects` counts DCP entries that are not tensors (pickled Python values).
    """

    role: str
    format: str
    path: str
    tensors: tuple[TensorSummary, ...]
    objects: int = 0

    @property
    def label(self) -> str:
        """`safetensors`, `dcp`, `adapter safetensors`, `optimizer dcp`, ..."""
        return self.format if self.role == MODEL else f"{self.role} {self.format}"

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "format": self.format,
            "label": self.label,
            "path": self.path,
            "num_tensors": len(self.tensors),
            "num_objects": self.objects,
            "total_bytes": self.total_bytes,
            "tensors": [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes}
                for t in self.tensors
            ],
        }


@dataclass(frozen=True)
class CheckpointDescription:
    """What a checkpoint holds. `training_step` is None outside a step directory of ours (a model
    directory, a DCP directory, another tool's step: `lerobot_step` for LeRobot's)."""

    path: str
    model_dir: str
    step_dir: str | None
    training_step: TrainingStep | None
    groups: tuple[TensorGroup, ...] = field(default_factory=tuple)
    layout: str = OURS
    layout_line: str = f"{OURS} layout"
    lerobot_step: LeRobotStep | None = None
    preferred: WeightSet | None = None

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(group.label for group in self.groups)

    @property
    def weights(self) -> TensorGroup | None:
        """The group a reader loads tensors from (`catalog.weights_for_report`): the model's
        safetensors, else its DCP shards, else an adapter; optimizer state for a bare `optimizer_0/`."""
        for group in self.groups:
            if self.preferred and (group.role, group.format, group.path) == (
                self.preferred.role,
                self.preferred.format,
                self.preferred.path,
            ):
                return group
        return None

    def to_dict(self) -> dict[str, Any]:
        step = self.training_step
        return {
            "path": self.path,
            "layout": self.layout,
            "lerobot": self.lerobot_step.to_dict() if self.lerobot_step else None,
            "model_dir": self.model_dir,
            "step_dir": self.step_dir,
            "step": step.step if step else None,
            "training_step": step.to_dict() if step else None,
            "topology": step.topology.describe() if step else None,
            "effective_batch": batch_factorization(step) if step else None,
            "effective_batch_size": step.effective_batch_size if step else None,
            "mixed_precision": step.mixed_precision if step else None,
            "checkpoint_format": step.checkpoint_format if step else None,
            "formats": list(self.formats),
            "groups": [group.to_dict() for group in self.groups],
        }


def batch_factorization(step: TrainingStep | LeRobotStep) -> str:
    """`8 x 4 x 2 = 64`: batch_size x dp_world_size x grad_accum_steps = samples per update."""
    total = step.batch_size * step.dp_world_size * step.grad_accum_steps
    return f"{step.batch_size} x {step.dp_world_size} x {step.grad_accum_steps} = {total}"


def describe_checkpoint(path: str | os.PathLike[str]) -> CheckpointDescription:
    """Describe a step directory, `checkpoints/last`, an output_dir, a model directory, a single
    `.safetensors` file or a DCP directory, from metadata alone."""
    text = os.fspath(path)
    cat = catalog(text)
    step = None
    if cat.step_dir and cat.layout != LEROBOT and storage.exists(cat.state_dir or ""):
        step = locate.read_training_step(cat.step_dir)  # an older release of ours is refused here
    groups = tuple(read_group(weights) for weights in cat.weight_sets)
    if not groups and step is None and cat.lerobot_step is None:
        raise NotACheckpointError(
            f"{text} holds no model weights ({layout.MODEL_SAFETENSORS}, {layout.MODEL_DCP_DIR}/, "
            f"{layout.ADAPTER_SAFETENSORS}) and no {layout.TRAINING_STATE_DIR}/; pass a step directory, "
            f"checkpoints/{layout.LAST} or a {layout.PRETRAINED_MODEL_DIR}/ directory"
        )
    return CheckpointDescription(
        path=text,
        model_dir=cat.model_dir,
        step_dir=cat.step_dir,
        training_step=step,
        groups=groups,
        layout=cat.layout,
        layout_line=cat.layout_line(),
        lerobot_step=cat.lerobot_step,
        preferred=weights_for_report(cat),
    )


def read_group(weights: WeightSet) -> TensorGroup:
    """The tensor summaries of one weight set, from its headers or `.metadata`."""
    return _READERS[weights.format](weights.role, weights.path)


def safetensors_group(role: str, path: str) -> TensorGroup:
    header = read_safetensors_header(path)
    return TensorGroup(role, SAFETENSORS, path, _summaries_from_header(header.tensors.values()))


def sharded_safetensors_group(role: str, index_path: str) -> TensorGroup:
    """All tensors of the shards a `model.safetensors.index.json` names, read from their headers."""
    shards = sorted(set(read_weight_map(index_path).values()))
    headers = [read_safetensors_header(layout.join(layout.parent(index_path), shard)) for shard in shards]
    return sharded_group_from_headers(role, index_path, headers)


def sharded_group_from_headers(
    role: str, index_path: str, headers: Iterable[SafetensorsHeader]
) -> TensorGroup:
    """The group of shards whose headers are already read (verify reads each once, to name a damaged
    shard once)."""
    tensors = [summary for header in headers for summary in _summaries_from_header(header.tensors.values())]
    return TensorGroup(role, SHARDED_SAFETENSORS, index_path, tuple(sorted(tensors, key=lambda t: t.name)))


def dcp_group(role: str, dcp_dir: str) -> TensorGroup:
    """Model and adapter groups list tensors under their model names (DCP's `model.` wrapper
    removed), so they compare with safetensors; optimizer groups list the optimizer keys as saved.
    A directory holding both (torchtitan's) gives each role only its own tensors."""
    return dcp_group_from_index(role, read_dcp_index(dcp_dir))


def dcp_group_from_index(role: str, index: DcpIndex) -> TensorGroup:
    entries = optimizer_tensors(index) if role == OPTIMIZER else model_tensors(index)
    tensors = tuple(
        TensorSummary(name, entry.dtype, entry.shape, entry.nbytes) for name, entry in sorted(entries.items())
    )
    return TensorGroup(role, DCP, index.path, tensors, objects=len(index.objects))


def _summaries_from_header(infos: Any) -> tuple[TensorSummary, ...]:
    return tuple(
        TensorSummary(info.name, info.dtype, info.shape, info.nbytes)
        for info in sorted(infos, key=lambda i: i.name)
    )


_READERS = {SAFETENSORS: safetensors_group, SHARDED_SAFETENSORS: sharded_safetensors_group, DCP: dcp_group}
