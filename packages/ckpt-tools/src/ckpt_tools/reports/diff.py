"""`ckpt diff A B`: which tensors differ between two checkpoints, and by how much.

Names, shapes and dtypes come from metadata (the same discovery as `ckpt inspect`). Values are then
compared one tensor at a time, each side loaded on its own (a byte range of a safetensors file, or one
key of a DCP directory) and reduced in bounded slices, so memory stays at a few tensors whatever the
model size. Either side may be in any format: a safetensors checkpoint diffs against a DCP one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ckpt_tools.dcp.index import read_dcp_index
from ckpt_tools.dcp.roles import model_tensors
from ckpt_tools.errors import NotACheckpointError, UsageError
from ckpt_tools.files import storage
from ckpt_tools.files.safetensors_io import read_safetensors_header
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import SAFETENSORS_TO_TORCH
from ckpt_tools.reports.describe import (
    DCP,
    OPTIMIZER,
    SAFETENSORS,
    SHARDED_SAFETENSORS,
    TensorGroup,
    TensorSummary,
    describe_checkpoint,
    read_weight_map,
)

if TYPE_CHECKING:
    import torch

# Elements reduced at once: bounds the float64 temporaries to ~3 x 128 MB per slice.
_SLICE = 1 << 24

EQUAL = "equal"
DIFFERENT = "different"
DTYPE_CHANGED = "dtype changed"
SHAPE_CHANGED = "shape changed"


@dataclass(frozen=True)
class TensorDiff:
    """One tensor present on both sides. `max_abs`/`max_rel` are None when shapes differ.

    `max_rel` is the largest |a - b| / max(|a|, |b|) over elements (0 where both are 0), so it lies in
    [0, 2] and does not blow up near zero. NaN equals NaN; NaN against a number counts as infinite.
    """

    name: str
    status: str
    dtype_a: str
    dtype_b: str
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    max_abs: float | None = None
    max_rel: float | None = None


@dataclass(frozen=True)
class DiffReport:
    a: str
    b: str
    atol: float
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    tensors: tuple[TensorDiff, ...]

    @property
    def differs(self) -> bool:
        return bool(self.only_a or self.only_b or any(t.status != EQUAL for t in self.tensors))

    @property
    def num_equal(self) -> int:
        return sum(t.status == EQUAL for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "atol": self.atol,
            "differs": self.differs,
            "only_a": list(self.only_a),
            "only_b": list(self.only_b),
            "tensors": [
                {**asdict(t), "shape_a": list(t.shape_a), "shape_b": list(t.shape_b)} for t in self.tensors
            ],
        }


def diff_checkpoints(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    atol: float = 0.0,
    on_tensor: Callable[[str], None] | None = None,
) -> DiffReport:
    """Compare the weights of two checkpoints (any path `ckpt inspect` accepts) tensor by tensor.

    A tensor is `equal` when every element differs by at most `atol`. `on_tensor(name)` is called
    before each value comparison, for progress display.
    """
    if atol < 0:
        raise UsageError(f"--atol must be >= 0, got {atol}", option="--atol")
    left, right = TensorSource.open(a), TensorSource.open(b)
    names_a, names_b = set(left.tensors), set(right.tensors)
    results = []
    for name in sorted(names_a & names_b):
        if on_tensor is not None:
            on_tensor(name)
        results.append(_diff_one(left, right, name, atol))
    return DiffReport(
        a=os.fspath(a),
        b=os.fspath(b),
        atol=atol,
        only_a=tuple(sorted(names_a - names_b)),
        only_b=tuple(sorted(names_b - names_a)),
        tensors=tuple(results),
    )


def _diff_one(left: TensorSource, right: TensorSource, name: str, atol: float) -> TensorDiff:
    x, y = left.tensors[name], right.tensors[name]
    shape_changed = TensorDiff(name, SHAPE_CHANGED, x.dtype, y.dtype, x.shape, y.shape)
    if x.shape != y.shape:
        return shape_changed
    max_abs, max_rel = value_difference(left.load(name), right.load(name))
    if x.dtype != y.dtype:
        status = DTYPE_CHANGED
    elif max_abs <= atol:
        status = EQUAL
    else:
        status = DIFFERENT
    return dataclasses.replace(shape_changed, status=status, max_abs=max_abs, max_rel=max_rel)


def value_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a - b|, max |a - b| / max(|a|, |b|)) over all elements, in float64, slice by slice."""
    import torch

    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    max_abs = max_rel = 0.0
    for start in range(0, flat_a.numel(), _SLICE):
        x = flat_a[start : start + _SLICE].to(torch.float64)
        y = flat_b[start : start + _SLICE].to(torch.float64)
        same = (x == y) | (x.isnan() & y.isnan())
        diff = torch.where(same, 0.0, (x - y).abs().nan_to_num(nan=math.inf))
        scale = torch.maximum(x.abs(), y.abs()).nan_to_num(nan=math.inf)
        rel = torch.where(diff == 0, 0.0, diff / scale).nan_to_num(nan=math.inf)
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(rel.max()))
    return max_abs, max_rel


class TensorSource:
    """The weights of one checkpoint: names, shapes and dtypes from metadata; values one at a time."""

    def __init__(self, group: TensorGroup, loaders: dict[str, Callable[[], torch.Tensor]]) -> None:
        self.group = group
        self.tensors: dict[str, TensorSummary] = {t.name: t for t in group.tensors}
        self._loaders = loaders

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> TensorSource:
        description = describe_checkpoint(path)
        group = description.weights
        if group is None:
            raise NotACheckpointError(f"{os.fspath(path)} holds no weights to compare")
        return cls(group, _LOADERS[group.format](group))

    def load(self, name: str) -> torch.Tensor:
        return self._loaders[name]()


def _safetensors_loaders(group: TensorGroup) -> dict[str, Callable[[], torch.Tensor]]:
    return _loaders_for_file(group.path)


def _sharded_loaders(group: TensorGroup) -> dict[str, Callable[[], torch.Tensor]]:
    base = layout.parent(group.path)
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    for shard in sorted(set(read_weight_map(group.path).values())):
        loaders.update(_loaders_for_file(layout.join(base, shard)))
    return loaders


def _loaders_for_file(path: str) -> dict[str, Callable[[], torch.Tensor]]:
    header = read_safetensors_header(path)

    def loader(name: str) -> Callable[[], torch.Tensor]:
        info = header.tensors[name]
        return lambda: _read_range(
            path, header.data_start + info.data_offsets[0], info.nbytes, info.dtype, info.shape
        )

    return {name: loader(name) for name in header.tensors}


def _read_range(path: str, offset: int, length: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One tensor's bytes from a safetensors file (local or fsspec), as a CPU tensor."""
    import torch

    torch_dtype = getattr(torch, SAFETENSORS_TO_TORCH[dtype])
    if length == 0:
        return torch.empty(shape, dtype=torch_dtype)
    with storage.open_file(path) as handle:
        handle.seek(offset)
        data = bytearray(handle.read(length))
    return torch.frombuffer(data, dtype=torch_dtype).reshape(shape)


def _dcp_loaders(group: TensorGroup) -> dict[str, Callable[[], torch.Tensor]]:
    """Each tensor through torch's own DCP reader, one key per call, without a process group.

    The `.metadata` already passed the restricted unpickler in `read_dcp_index` before torch reads it.
    """
    index = read_dcp_index(group.path)
    entries = index.tensors if group.role == OPTIMIZER else model_tensors(index)

    def loader(key: str, shape: tuple[int, ...], dtype: str) -> Callable[[], torch.Tensor]:
        return lambda: _load_dcp_key(group.path, key, shape, dtype)

    return {name: loader(entry.name, entry.shape, entry.dtype) for name, entry in entries.items()}


def _load_dcp_key(dcp_dir: str, key: str, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    import torch
    import torch.distributed.checkpoint as dcp

    from ckpt_tools.tensors.tensor_io import dcp_reader  # here, not at the top: it imports torch

    target = torch.empty(shape, dtype=getattr(torch, SAFETENSORS_TO_TORCH[dtype]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... assuming single process"
        dcp.load({key: target}, storage_reader=dcp_reader(dcp_dir), no_dist=True)
    return target


_LOADERS: dict[str, Callable[[TensorGroup], dict[str, Callable[[], torch.Tensor]]]] = {
    SAFETENSORS: _safetensors_loaders,
    SHARDED_SAFETENSORS: _sharded_loaders,
    DCP: _dcp_loaders,
}
