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

from ckpt_tools import catalog
from ckpt_tools.dcp.index import read_dcp_index
from ckpt_tools.dcp.roles import model_tensors
from ckpt_tools.errors import NotACheckpointError
from ckpt_tools.files import storage
from ckpt_tools.files.locate import read_training_step
from ckpt_tools.format import layout, weight_sets
from ckpt_tools.format.meta import TrainingStep
from ckpt_tools.tensors.tensor_io import read_dcp_full, read_safetensors, read_safetensors_model

__all__ = ["Checkpoint", "load_model_state_dict", "open_checkpoint"]


@dataclass(frozen=True)
class Checkpoint:
    """An opened checkpoint. `step_dir` is None outside a step directory (a converted, downloaded or
    DCP directory); `model_dir` holds the weights; `formats` lists the weight sets present in the
    catalog's vocabulary (`safetensors`, `sharded safetensors`, `dcp`, `adapter safetensors`,
    `adapter dcp`, `ema safetensors`, `ema dcp`; optimizer state is not a weight set of the model);
    `layout` says whose layout it is (`ckpt-tools`, `LeRobot`, ...); `weight_sets`: what a reader can
    ask for with `weights=` (`model`, and `ema` when the step holds the EMA of its trained parameters);
    `has_ema`: `ema` is one of them."""

    step_dir: str | None
    model_dir: str
    formats: tuple[str, ...]
    layout: str = catalog.OURS
    is_adapter: bool = False
    publishable: bool = False
    weight_sets: tuple[str, ...] = (weight_sets.MODEL.name,)

    @property
    def has_ema(self) -> bool:
        return weight_sets.EMA.name in self.weight_sets

    @property
    def default_weights(self) -> str:
        """What a reader takes when not told: the EMA when the run kept one, else the model."""
        return weight_sets.default_choice(self.weight_sets)

    def choose_weights(self, weights: str | None = None) -> str:
        """`weights` checked against what this checkpoint holds (one line for a name that is no weight
        set, or a set it lacks); None gives `default_weights`."""
        if weights is None:
            return self.default_weights
        kind = weight_sets.choose(weights)
        if kind.name not in self.weight_sets:
            raise weight_sets.missing(self.model_dir, kind)
        return kind.name

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
    """Open a step directory, `checkpoints/last`, a run's output_dir, a `pretrained_model/`, a model
    directory, a `.safetensors` file or a DCP directory.

    `is_adapter`: what loads is a PEFT adapter (merge it into its base); `publishable`: the Hub can
    load the weights as they are (else `ckpt convert` first). Raises `CheckpointNotFoundError` for a
    missing path and `NotACheckpointError` when the path holds no model weights in any format.
    """
    cat, preferred = _loadable(path)
    return Checkpoint(
        step_dir=cat.step_dir,
        model_dir=cat.model_dir,
        formats=tuple(w.label for w in cat.weight_sets if w.role != catalog.OPTIMIZER),
        layout=cat.layout,
        is_adapter=preferred.role == catalog.ADAPTER,
        publishable=catalog.weights_for_publishing(cat) is not None,
        weight_sets=tuple(
            kind.name
            for kind in weight_sets.WEIGHT_SETS
            if kind.choosable and (kind.overlays is None or catalog.overlay_for_loading(cat, kind))
        ),
    )


def _loadable(path: str | os.PathLike[str]) -> tuple[catalog.Catalog, catalog.WeightSet]:
    """The catalog of `path` and the weight set a loader takes; one line when there is none."""
    cat = catalog.catalog(path)
    preferred = catalog.weights_for_loading(cat)
    if preferred is None:
        raise NotACheckpointError(
            f"{os.fspath(path)} holds no model weights ({layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX}, "
            f"{layout.MODEL_DCP_DIR}/ or an adapter); pass a step directory or a pretrained_model/"
        )
    return cat, preferred


def load_model_state_dict(
    path: str | os.PathLike[str], *, dtype: torch.dtype | None = None, weights: str = "model"
) -> dict[str, torch.Tensor]:
    """The full model state dict on CPU, from the weight set `catalog.weights_for_loading` picks.

    Safetensors is preferred when present (cheapest to read), then DCP shards written by any number of
    ranks, in any layout (ours, accelerate's `model` entry, torchtitan's top-level tensors): only model
    tensors, never optimizer state. A PEFT checkpoint holds only its adapter: its tensors are returned
    under PEFT's names (merge them with `ckpt_tools.state.adapters`). `dtype` casts floating tensors.

    `weights="ema"` returns the same state dict with the step's EMA shadow in place of the trained
    tensors it averages (the EMA holds parameters only: buffers and frozen weights come from the model
    set, so the result loads like the model's); a step without EMA is refused with one line.
    """
    kind = weight_sets.choose(weights)
    cat, preferred = _loadable(path)
    tensors = read_weight_set(preferred)
    if kind.overlays is not None:
        overlay = catalog.overlay_for_loading(cat, kind)
        if overlay is None:
            raise weight_sets.missing(os.fspath(path), kind)
        tensors = {**tensors, **read_weight_set(overlay)}
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    return tensors


def read_weight_set(weights: catalog.WeightSet) -> dict[str, torch.Tensor]:
    """Every tensor of one model, adapter or EMA weight set, full and on CPU."""
    if weights.format == catalog.SAFETENSORS:
        return read_safetensors(weights.path)[0]
    if weights.format == catalog.SHARDED_SAFETENSORS:
        return read_safetensors_model(layout.parent(weights.path))
    entries = model_tensors(read_dcp_index(weights.path))
    return read_dcp_full(weights.path, {name: entry.name for name, entry in entries.items()})
