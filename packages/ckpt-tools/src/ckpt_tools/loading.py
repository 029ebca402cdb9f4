"""Open any checkpoint and load its full model state dict on CPU, for evaluation pipelines.

Whatever wrote the step (one process or many, FSDP2, HSDP or DDP; safetensors, sharded safetensors or
DCP shards), `load_model_state_dict` returns plain full tensors keyed by parameter name, with no
process group needed. Paths go through fsspec, so `memory://` and `file://` URLs work like local paths.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from ckpt_tools import layout, storage
from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError
from ckpt_tools.meta import TrainingStep
from ckpt_tools.state import ProcessorState, dcp_reader, quiet_single_process

__all__ = ["Checkpoint", "load_model_state_dict", "load_processors", "open_checkpoint"]

# Names of the weight formats `Checkpoint.formats` reports, in this order.
SAFETENSORS = "safetensors"  # model.safetensors, or model-0000k-of-0000n.safetensors + index
DCP = "dcp"  # pytorch_model_fsdp_0/
ADAPTER_SAFETENSORS = "adapter_safetensors"  # PEFT: adapter_model.safetensors
ADAPTER_DCP = "adapter_dcp"  # PEFT: adapter_model_fsdp_0/


@dataclass(frozen=True)
class Checkpoint:
    """An opened checkpoint. `step_dir` is None for a bare model directory (converted or downloaded);
    `model_dir` is the `pretrained_model/` holding the weights; `formats` lists the weight formats
    present: `safetensors`, `dcp`, `adapter_safetensors`, `adapter_dcp`."""

    step_dir: str | None
    model_dir: str
    formats: tuple[str, ...]

    def training_step(self) -> TrainingStep:
        """The run's `training_step.json` (step, topology, batch factorization, format)."""
        if self.step_dir is None:
            raise NotACheckpointError(
                f"{self.model_dir} is a model directory without training_state/; open a step directory"
            )
        return storage.read_training_step(self.step_dir)

    def policy_config(self) -> dict[str, Any]:
        return _read_json_object(layout.join(self.model_dir, layout.POLICY_CONFIG))

    def train_config(self) -> dict[str, Any]:
        return _read_json_object(layout.join(self.model_dir, layout.TRAIN_CONFIG))


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open a step directory, `checkpoints/last`, a run's output_dir or a `pretrained_model/`.

    Raises `CheckpointNotFoundError` for a missing path and `NotACheckpointError` when the directory
    holds no weights in any format.
    """
    step_dir, model_dir = storage.resolve_model_dir(path)
    formats = _formats(model_dir)
    if not formats:
        raise NotACheckpointError(
            f"{os.fspath(path)} holds no model weights ({layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX}, "
            f"{layout.MODEL_DCP_DIR}/ or an adapter); pass a step directory or a pretrained_model/"
        )
    return Checkpoint(step_dir=step_dir, model_dir=model_dir, formats=formats)


def _formats(model_dir: str) -> tuple[str, ...]:
    def has(*parts: str) -> bool:
        return storage.exists(layout.join(model_dir, *parts))

    found = []
    if has(layout.MODEL_SAFETENSORS) or has(layout.MODEL_INDEX):
        found.append(SAFETENSORS)
    if has(layout.MODEL_DCP_DIR, layout.DCP_METADATA):
        found.append(DCP)
    if has(layout.ADAPTER_SAFETENSORS):
        found.append(ADAPTER_SAFETENSORS)
    if has(layout.ADAPTER_DCP_DIR, layout.DCP_METADATA):
        found.append(ADAPTER_DCP)
    return tuple(found)


def load_model_state_dict(
    path: str | os.PathLike[str], *, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The full model state dict on CPU, from whichever format the checkpoint holds.

    Safetensors is preferred when present (cheapest to read), then DCP shards written by any number of
    ranks. A PEFT checkpoint holds only its adapter: its tensors are returned under PEFT's names (merge
    them with `ckpt_tools.adapters`). `dtype` casts floating tensors; others keep their dtype.
    """
    checkpoint = open_checkpoint(path)
    model_dir = checkpoint.model_dir
    if SAFETENSORS in checkpoint.formats:
        tensors = read_safetensors_model(model_dir)
    elif DCP in checkpoint.formats:
        tensors = read_dcp_full(layout.join(model_dir, layout.MODEL_DCP_DIR))
    elif ADAPTER_SAFETENSORS in checkpoint.formats:
        tensors, _ = read_safetensors(layout.join(model_dir, layout.ADAPTER_SAFETENSORS))
    else:
        tensors = read_dcp_full(layout.join(model_dir, layout.ADAPTER_DCP_DIR))
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    return tensors


def load_processors(path: str | os.PathLike[str]) -> dict[str, ProcessorState]:
    """The policy's pre/post-processors saved with the checkpoint, by name (absent ones left out)."""
    _, model_dir = storage.resolve_model_dir(path)
    found = {}
    for name in (layout.PREPROCESSOR, layout.POSTPROCESSOR):
        config_path = layout.join(model_dir, layout.processor_config_name(name))
        if not storage.exists(config_path):
            continue
        steps: list[dict[str, torch.Tensor]] = []
        while storage.exists(
            step_path := layout.join(model_dir, layout.processor_step_name(name, len(steps)))
        ):
            steps.append(read_safetensors(step_path)[0])
        found[name] = ProcessorState(config=_read_json_object(config_path), step_tensors=steps)
    return found


def read_safetensors(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and header metadata of one safetensors file, local or through fsspec."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load

    from ckpt_tools.safetensors_io import read_safetensors_header

    fs, inner = storage.resolve(path)
    try:
        if storage.is_local(fs) and fs.exists(inner):
            with safe_open(inner, framework="pt") as handle:
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
                return tensors, handle.metadata() or {}
        header = read_safetensors_header(path)  # validates, and names the file when it is damaged
        return load(storage.read_bytes(path)), header.metadata
    except SafetensorError as exc:
        raise CorruptCheckpointError(f"{path}: {exc}; the file is damaged, re-copy or re-save it") from exc


def read_safetensors_model(model_dir: str) -> dict[str, torch.Tensor]:
    """`model.safetensors`, or every shard named by `model.safetensors.index.json`."""
    single = layout.join(model_dir, layout.MODEL_SAFETENSORS)
    if storage.exists(single):
        return read_safetensors(single)[0]
    index_path = layout.join(model_dir, layout.MODEL_INDEX)
    weight_map = _read_json_object(index_path).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CorruptCheckpointError(f"{index_path} has no weight_map object; re-run `ckpt convert`")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(layout.join(model_dir, shard))[0])
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise CorruptCheckpointError(
            f"{index_path} names {len(missing)} tensors missing from its shards (first: {missing[0]}); "
            "re-run `ckpt convert`"
        )
    return tensors


def validate_dcp_metadata(dcp_dir: str) -> Any:
    """Read a DCP directory's `.metadata` with the restricted unpickler before torch unpickles it,
    so a crafted checkpoint is refused (UnsafePickleError) instead of running code."""
    from ckpt_tools.safe_pickle import restricted_loads

    path = layout.join(dcp_dir, layout.DCP_METADATA)
    return restricted_loads(storage.read_bytes(path), what=path)


def read_dcp_full(dcp_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP directory as one full CPU tensor, in this process alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    validate_dcp_metadata(dcp_dir)
    reader = dcp_reader(dcp_dir)
    metadata = reader.read_metadata()
    state: dict[str, Any] = {
        key: torch.empty(entry.size, dtype=entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }
    with quiet_single_process():
        dcp.load(state, storage_reader=dcp_reader(dcp_dir), no_dist=True)
    return state


def _read_json_object(path: str) -> dict[str, Any]:
    try:
        data = json.loads(storage.read_text(path))
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointError(f"{path} is not valid JSON ({exc}); the file is damaged") from exc
    if not isinstance(data, dict):
        raise CorruptCheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
