"""Open any checkpoint and load its full model state dict on CPU, for evaluation pipelines.

Whatever wrote the step (one process or many, FSDP2, HSDP or DDP; safetensors, sharded safetensors or
DCP shards), `load_model_state_dict` returns plain full tensors keyed by parameter name, with no
process group needed. Paths go through fsspec, so `memory://` and `file://` URLs work like local paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ckpt_tools import layout, storage
from ckpt_tools.errors import NotACheckpointError
from ckpt_tools.locate import read_training_step, resolve_model_dir
from ckpt_tools.meta import TrainingStep
from ckpt_tools.tensor_io import read_dcp_full, read_safetensors, read_safetensors_model

__all__ = ["Checkpoint", "load_model_state_dict", "open_checkpoint"]

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
        return read_training_step(self.step_dir)

    def policy_config(self) -> dict[str, Any]:
        return storage.read_json_object(layout.join(self.model_dir, layout.POLICY_CONFIG))

    def train_config(self) -> dict[str, Any]:
        return storage.read_json_object(layout.join(self.model_dir, layout.TRAIN_CONFIG))


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open a step directory, `checkpoints/last`, a run's output_dir or a `pretrained_model/`.

    Raises `CheckpointNotFoundError` for a missing path and `NotACheckpointError` when the directory
    holds no weights in any format.
    """
    step_dir, model_dir = resolve_model_dir(path)
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
