"""Collective load of a run's state into a prepared model, optimizer, scheduler and scaler (phase 2
of a resume, docs/resume.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful  # state_dict() and load_state_dict()
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # not re-exported

from ckpt_tools.catalog import (
    ADAPTER,
    DCP,
    SAFETENSORS,
    WeightSet,
    catalog,
    overlay_for_resume,
    weights_for_resume,
)
from ckpt_tools.errors import (
    CheckpointError,
    CorruptCheckpointError,
    LegacyCheckpointError,
    NotACheckpointError,
)
from ckpt_tools.files import storage
from ckpt_tools.files.locate import read_training_step, resolve_model_dir
from ckpt_tools.files.safetensors_io import SafetensorsHeader, read_safetensors_header
from ckpt_tools.files.sharded_safetensors import shard_headers
from ckpt_tools.format import layout, weight_sets
from ckpt_tools.format.meta import TrainingStep
from ckpt_tools.format.untrusted import MAX_CONFIG_BYTES, check_like
from ckpt_tools.state.adapters import adapter_keys
from ckpt_tools.state.collective import Group, is_sharded
from ckpt_tools.state.evaluation_load import read_weight_set
from ckpt_tools.state.optim_codec import read_optimizer_safetensors, read_optimizer_skeleton, restore_tuples
from ckpt_tools.tensors.tensor_io import (
    dcp_load,
    dcp_reader,
    read_safetensors_block,
    validate_dcp_metadata,
)


def load_training_state(
    step_dir: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Stateful | None = None,
    scaler: Stateful | None = None,
    process_group: dist.ProcessGroup | None = None,
    extra_weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> frozenset[str]:
    """Collective: call on all ranks after the model and optimizer are prepared (phase 2 of a resume).

    Loads whatever format the step holds into the current topology. DCP shards are resharded by torch
    (N -> M ranks, FSDP2 <-> HSDP, sharded -> DDP/plain). Gathered safetensors weights go into a
    sharded model block by block: each rank reads only its own shards' rows; a non-sharded run's
    `optimizer_state.safetensors` goes into a sharded optimizer the same way.
    A sharded run's checkpoint without `optimizer_0/` (an older release's gathered optimizer) is
    refused with `LegacyCheckpointError`. `step_dir` may also be `last` or an output_dir.

    `extra_weights` (the run's weight sets beside the model by name, as `SaveRequest` takes them:
    the EMA shadow) are filled in place from the step's sets by the model's rules (DCP resharded by
    torch, a gathered file block by block). Returns the names of those it filled: a set the step was
    saved without is left as it is.
    """
    group = Group(process_group)
    step, model_dir = resolve_model_dir(step_dir)
    if step is None:
        raise NotACheckpointError(f"{os.fspath(step_dir)} has no training_state/; pass a step directory")
    saved = read_training_step(step)
    extras = [(weight_sets.extra(name), state) for name, state in (extra_weights or {}).items()]
    state_dir = layout.join(step, layout.TRAINING_STATE_DIR)
    _load_model(model_dir, model, group)
    if optimizer is not None:
        _load_optimizer(state_dir, saved, model, optimizer, group)
    if scheduler is not None:
        scheduler.load_state_dict(_checked_state(layout.join(state_dir, layout.SCHEDULER_STATE), scheduler))
    if scaler is not None and storage.exists(layout.join(state_dir, layout.SCALER_STATE)):
        scaler.load_state_dict(_checked_state(layout.join(state_dir, layout.SCALER_STATE), scaler))
    return frozenset(kind.name for kind, state in extras if _load_extra(model_dir, kind, state, model, group))


def _load_extra(
    model_dir: str,
    kind: weight_sets.WeightSetKind,
    live: Mapping[str, torch.Tensor],
    model: nn.Module,
    group: Group,
) -> bool:
    """Fill a weight set beside the model (the EMA shadow) in place from the step's set of that kind (a
    PEFT step's under the adapter's key names, as `save` wrote it); False when the step has none."""
    cat = catalog(model_dir)
    weights = overlay_for_resume(cat, kind, sharded=is_sharded(model))
    if weights is None:
        return False
    keys = adapter_keys(model) if cat.of_role(ADAPTER) else {name: name for name in live}
    state = {keys[name]: value for name, value in live.items()}
    if weights.format == DCP:
        validate_dcp_metadata(weights.path)
        dcp_load(dict(state), weights.path, group.pg, group.distributed)
        return True
    header = read_safetensors_header(weights.path)
    _check_fits(header, state, "the run's", "model and --ema/--peft settings")  # before the first copy
    for name, value in state.items():
        _copy_own_block(header, name, value)
    return True


def _checked_state(path: str, target: Stateful) -> dict[str, Any]:
    """A scheduler's or loss scaler's saved state, refused unless each value it shares with the live
    object's own `state_dict()` has that value's type (a string step count is one line here, not a
    TypeError at the first step)."""
    saved = storage.read_json_object(path, MAX_CONFIG_BYTES)
    check_like(saved, target.state_dict(), path)
    return saved


def _load_model(model_dir: str, model: nn.Module, group: Group) -> None:
    """Load the weight set `catalog.weights_for_resume` picks for this model's sharding."""
    sharded = is_sharded(model)
    weights = weights_for_resume(catalog(model_dir), sharded=sharded)
    if weights is None:
        raise NotACheckpointError(
            f"{model_dir} holds no model weights ({layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX}, "
            f"{layout.MODEL_DCP_DIR}/ or an adapter); the checkpoint is incomplete"
        )
    if weights.role == ADAPTER:
        _load_adapter(model_dir, weights, model, group)
    elif weights.format == DCP:
        state = get_model_state_dict(model)
        dcp_load(state, weights.path, group.pg, group.distributed)
        set_model_state_dict(model, state)
    elif sharded:
        _load_full_into_shards(weights, model)
    else:
        full: dict[str, Any] = read_weight_set(weights)
        set_model_state_dict(model, full)


def load_model_weights(
    path: str | os.PathLike[str],
    model: nn.Module,
    process_group: dist.ProcessGroup | None = None,
    saved_names: Mapping[str, str] | None = None,
) -> None:
    """Collective on a sharded model: the model weights at `path` (a step, model or DCP directory, a
    `.safetensors` file; not an adapter) into `model`, prepared or plain, each rank reading only what
    it holds: DCP shards resharded by torch, safetensors (one file or the shards of an index) one
    ranged read per tensor, never a whole file, so a rank's peak is its shard plus one tensor. Every
    shape is checked before the first copy. `saved_names` (model tensor name -> its name at `path`)
    reads only those tensors, under other names: a wrapper's base (a PEFT model's frozen weights from
    the base's checkpoint); the model's other tensors keep their values."""
    group = Group(process_group)
    cat = catalog(os.fspath(path))
    weights = weights_for_resume(cat, sharded=is_sharded(model))
    if weights is None or weights.role == ADAPTER:
        raise NotACheckpointError(
            f"{os.fspath(path)} holds no model weights ({layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX} or "
            f"{layout.MODEL_DCP_DIR}/); merge an adapter into its base first (`ckpt merge-adapter`)"
        )
    if weights.format == DCP:
        validate_dcp_metadata(weights.path)
        state: dict[str, Any] = get_model_state_dict(model)
        names = _saved_names(state, saved_names)
        saved = {names[name]: state[name] for name in names}
        dcp_load(saved, weights.path, group.pg, group.distributed)
        loaded = {name: saved[names[name]] for name in names}
        set_model_state_dict(model, loaded, options=StateDictOptions(strict=saved_names is None))
    else:
        _load_full_into_shards(weights, model, saved_names)


def _saved_names(state: Mapping[str, Any], saved_names: Mapping[str, str] | None) -> dict[str, str]:
    """Model tensor name -> its name in the checkpoint: every tensor under its own name by default."""
    return dict(saved_names) if saved_names is not None else {name: name for name in state}


def _load_full_into_shards(
    weights: WeightSet, model: nn.Module, saved_names: Mapping[str, str] | None = None
) -> None:
    """Gathered safetensors weights into a sharded model: each rank reads only the blocks its own
    shards hold (one ranged read per tensor, `read_safetensors_block`), never the whole file, so a
    resume needs no more host memory per rank than a fresh start plus that rank's shard.
    `saved_names` as `load_model_weights` takes it."""
    headers = _headers_by_tensor(weights)
    state: dict[str, Any] = get_model_state_dict(model)
    names = _saved_names(state, saved_names)
    missing = sorted(saved for saved in names.values() if saved not in headers)
    if missing:
        raise CorruptCheckpointError(
            f"{weights.path} lacks {len(missing)} of the model's tensors (first: {missing[0]}); "
            "resume from a checkpoint of this model"
        )
    for name, saved in names.items():  # every shape before the first copy: a refusal changes nothing
        header = headers[saved]
        if tuple(header.tensors[saved].shape) != tuple(state[name].shape):
            raise CorruptCheckpointError(
                f"{header.path}: {saved} has shape {list(header.tensors[saved].shape)}, the model's is "
                f"{list(state[name].shape)}; resume from a checkpoint of this model"
            )
    for name, saved in names.items():
        _copy_own_block(headers[saved], saved, state[name])
    loaded = {name: state[name] for name in names}
    set_model_state_dict(model, loaded, options=StateDictOptions(strict=saved_names is None))


def _copy_own_block(header: SafetensorsHeader, name: str, value: torch.Tensor) -> None:
    """Fill `value` from tensor `name` of a gathered safetensors file: a DTensor from the block its
    local shard holds (one ranged read), a replicated tensor (a buffer, an ignored module, a step
    count) whole."""
    with torch.no_grad():
        if isinstance(value, DTensor):
            shape, offset = compute_local_shape_and_global_offset(
                value.shape, value.device_mesh, value.placements
            )
            value.to_local().copy_(read_safetensors_block(header, name, offset, shape))
        else:
            value.copy_(read_safetensors_block(header, name, (0,) * value.dim(), tuple(value.shape)))


def _headers_by_tensor(weights: WeightSet) -> dict[str, SafetensorsHeader]:
    """Tensor name -> the header of the file holding it (one file, or the shards of an index)."""
    if weights.format == SAFETENSORS:
        header = read_safetensors_header(weights.path)
        return dict.fromkeys(header.tensors, header)
    return shard_headers(weights.path)


def _load_adapter(model_dir: str, weights: WeightSet, model: nn.Module, group: Group) -> None:
    """Load a PEFT checkpoint's adapter into the model's trainable parameters (the base stays as built)."""
    keys = adapter_keys(model)
    state: dict[str, Any]
    if weights.format == DCP:
        validate_dcp_metadata(weights.path)
        saved = set(dcp_reader(weights.path).read_metadata().state_dict_metadata)
        _check_adapter_keys(model_dir, saved, keys)
        local = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=True))
        state = {keys[name]: local[name] for name in keys}
        dcp_load(state, weights.path, group.pg, group.distributed)
        full_state = False
    else:
        state = read_weight_set(weights)
        _check_adapter_keys(model_dir, set(state), keys)
        full_state = is_sharded(model)
    options = StateDictOptions(full_state_dict=full_state, strict=False)
    set_model_state_dict(model, {name: state[key] for name, key in keys.items()}, options=options)


def _check_adapter_keys(model_dir: str, saved: set[str], keys: dict[str, str]) -> None:
    """The adapter must hold exactly the model's trainable tensors, so none is silently left as built."""
    wanted = set(keys.values())
    if saved != wanted:
        first = sorted(wanted - saved) or sorted(saved - wanted)
        raise CheckpointError(
            f"{model_dir}: the adapter holds {len(saved)} tensors, this model trains {len(wanted)} "
            f"({first[0]} is in only one of them); build the model with the --peft settings the "
            "adapter was trained with"
        )


def _load_optimizer(
    state_dir: str, saved: TrainingStep, model: nn.Module, optimizer: torch.optim.Optimizer, group: Group
) -> None:
    dcp_dir = layout.join(state_dir, layout.OPTIMIZER_DCP_DIR)
    if storage.exists(layout.join(dcp_dir, layout.DCP_METADATA)):
        saved_paths = validate_dcp_metadata(dcp_dir).paths.values()
        osd: dict[str, Any] = get_optimizer_state_dict(model, optimizer)
        if saved_paths and all(path[0] == "param_groups" for path in saved_paths):
            osd["state"] = {}  # saved before its first update (`save._optimizer_state`): stays without state
        dcp_load(osd, dcp_dir, group.pg, group.distributed)
        set_optimizer_state_dict(model, optimizer, osd)
        return
    if saved.topology.is_sharded:
        raise LegacyCheckpointError(
            f"{state_dir} is from a sharded run but has no {layout.OPTIMIZER_DCP_DIR}/ (an older release's "
            "gathered optimizer state): it cannot be resumed; start a new run from its weights (--policy.path)"
        )
    if not storage.exists(layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS)):
        raise CorruptCheckpointError(
            f"{state_dir} has neither {layout.OPTIMIZER_DCP_DIR}/ nor {layout.OPTIMIZER_SAFETENSORS}; "
            "the checkpoint is incomplete: resume from an earlier step"
        )
    before = [dict(group) for group in optimizer.param_groups]
    if is_sharded(model):
        _load_full_optimizer_into_shards(state_dir, model, optimizer)
    else:
        set_optimizer_state_dict(model, optimizer, read_optimizer_safetensors(state_dir, optimizer))
    restore_tuples(optimizer.param_groups, before)  # torch's state-dict paths may turn tuples into lists


def _check_fits(
    header: SafetensorsHeader, tensors: Mapping[str, torch.Tensor], whose: str, settings: str
) -> None:
    """Every name and shape of `tensors` in the file `header` describes, else one line naming the first
    misfit and the `settings` to resume with: checked before the first byte is copied."""
    for name, value in tensors.items():
        saved = header.tensors.get(name)
        if saved is None or tuple(saved.shape) != tuple(value.shape):
            what = "lacks" if saved is None else f"has shape {list(saved.shape)} for"
            raise CorruptCheckpointError(
                f"{header.path} {what} {name} ({whose} is {list(value.shape)}); resume with the "
                f"{settings} the checkpoint was trained with"
            )


def _load_full_optimizer_into_shards(
    state_dir: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """A non-sharded run's `optimizer_state.safetensors` into a sharded model's optimizer (DDP resumed
    as FSDP2): each rank reads only the blocks of its own shards' moments, as `_load_full_into_shards`
    does for the weights, never the whole file (twice the weights for AdamW) on every rank."""
    saved, header = read_optimizer_skeleton(state_dir, optimizer)
    osd: dict[str, Any] = get_optimizer_state_dict(model, optimizer)  # this rank's shards, to fill
    state: dict[str, dict[str, Any]] = {}
    for fqn, param_state in osd["state"].items():
        tensors = {
            f"state/{fqn}/{name}": value for name, value in param_state.items() if torch.is_tensor(value)
        }
        if fqn not in saved["state"] and not any(key in header.tensors for key in tensors):
            continue  # a parameter the saved run never stepped keeps no state, as in a full load
        _check_fits(header, tensors, "this optimizer's", "model and optimizer settings")  # before any copy
        state[fqn] = {**saved["state"].get(fqn, {}), **param_state}
    for fqn, param_state in state.items():
        for name, entry in param_state.items():
            if torch.is_tensor(entry):
                _copy_own_block(header, f"state/{fqn}/{name}", entry)
    loaded: dict[str, Any] = {"state": state, "param_groups": saved["param_groups"]}
    set_optimizer_state_dict(model, optimizer, loaded)
