"""Collective saves and loads of a run's state: model, optimizer, RNG, scheduler, scaler, processors.

One code path serves a plain model, DDP and FSDP2/HSDP: `torch.distributed.checkpoint.state_dict`
returns state dicts keyed by parameter names (no `module.` prefix, no optimizer parameter ids)
whatever the wrapping, with DTensors on a sharded model. Full tensors are gathered where the format
wants one file (only the main rank of the group writes it); DCP directories are written by every rank.

A step is written under `checkpoints/.tmp-<step>/` and renamed when complete; `last` moves after that
(storage.commit_step_dir). docs/format.md is the spec of every file written here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from ckpt_tools import layout, storage
from ckpt_tools.adapters import peft_key
from ckpt_tools.errors import (
    CheckpointError,
    CorruptCheckpointError,
    LegacyCheckpointError,
    NotACheckpointError,
)
from ckpt_tools.meta import TrainingStep
from ckpt_tools.storage import latest_step_dir, read_training_step

__all__ = [
    "ProcessorState",
    "latest_step_dir",
    "load_rng_state",
    "load_training_state",
    "read_training_step",
    "save_checkpoint",
    "save_rng_state",
]

_FULL_ON_MAIN = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class ProcessorState:
    """A pre/post-processor of the policy: its JSON config and one tensor dict per processor step.

    Saved as `<name>.json` plus `<name>_step_<i>.safetensors` for every step, an empty file included,
    so step indices stay dense. Names are `layout.PREPROCESSOR` and `layout.POSTPROCESSOR`.
    """

    config: dict[str, Any]
    step_tensors: list[dict[str, torch.Tensor]]


class _Group:
    """Rank, size and barrier of the process group a collective runs on; one process without one."""

    def __init__(self, process_group: dist.ProcessGroup | None) -> None:
        self.pg = process_group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if self.distributed else 0
        self.world_size = dist.get_world_size(process_group) if self.distributed else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.pg)


def is_sharded(model: nn.Module) -> bool:
    """True when the parameters are DTensors (FSDP2 or HSDP): the optimizer is then saved as DCP."""
    return any(isinstance(param, DTensor) for param in model.parameters())


# ---------------------------------------------------------------------------------------------- save


def save_checkpoint(
    checkpoints_dir: str | os.PathLike[str],
    training_step: TrainingStep,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    policy_config: dict[str, Any],
    train_config: dict[str, Any],
    processors: Mapping[str, ProcessorState] | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    process_group: dist.ProcessGroup | None = None,
    adapter_config: Mapping[str, Any] | None = None,
) -> str:
    """Collective: call on all ranks. Write `<checkpoints_dir>/<step:06d>/` and move `last` to it.

    `model` is the prepared model (plain, DDP-wrapped, or FSDP2/HSDP-sharded). The weights go out in
    `training_step.checkpoint_format`: `safetensors` gathers the full (fp32 master) weights into
    `model.safetensors`, `dcp` writes `pytorch_model_fsdp_0/` from every rank, `safetensors_dcp` both.
    The optimizer is DCP (`optimizer_0/`) on a sharded model, else `optimizer_state.safetensors` +
    `optimizer_param_groups.json`. `processors` keys are `layout.PREPROCESSOR` / `layout.POSTPROCESSOR`.
    Every rank's RNG state is gathered into `rng_state.safetensors`. Returns the final step directory.

    A PEFT run passes `adapter_config` (peft's config as JSON, `base_model_name_or_path` included): the
    weights saved are then only the trainable ones, under peft's key names (`peft_key`), as
    `adapter_model.safetensors` and/or `adapter_model_fsdp_0/` by the same format rule, beside
    `adapter_config.json`; the frozen base is not written.
    """
    group = _Group(process_group)
    _check_processors(processors)
    root = os.fspath(checkpoints_dir).rstrip("/")
    tmp = storage.tmp_step_dir(root, training_step.step)
    if group.is_main:
        storage.begin_step_dir(root, training_step.step)
        storage.makedirs(layout.join(tmp, layout.PRETRAINED_MODEL_DIR))
        storage.makedirs(layout.join(tmp, layout.TRAINING_STATE_DIR))
    group.barrier()
    model_dir = layout.join(tmp, layout.PRETRAINED_MODEL_DIR)
    if adapter_config is None:
        _save_model(model_dir, model, training_step.checkpoint_format, group)
    else:
        _save_adapter(model_dir, model, training_step.checkpoint_format, group)
    _save_optimizer(layout.join(tmp, layout.TRAINING_STATE_DIR), model, optimizer, group)
    save_rng_state(tmp, group.rank, group.world_size, process_group=process_group)
    if group.is_main:
        _write_side_files(
            tmp, training_step, policy_config, train_config, processors, scheduler, scaler, adapter_config
        )
    group.barrier()  # every rank's shards are on disk before the directory becomes visible
    final = layout.join(root, layout.step_dir_name(training_step.step))
    if group.is_main:
        storage.commit_step_dir(tmp, root, training_step.step)
    group.barrier()  # nobody returns (and maybe reads `last`) before the commit
    return final


def _check_processors(processors: Mapping[str, ProcessorState] | None) -> None:
    """Refuse an unknown processor name before the first byte is written."""
    for name in processors or {}:
        if name not in (layout.PREPROCESSOR, layout.POSTPROCESSOR):
            raise ValueError(
                f"processor {name!r} is not one of {layout.PREPROCESSOR!r}, {layout.POSTPROCESSOR!r}; "
                "use the names in ckpt_tools.layout"
            )


def _save_model(model_dir: str, model: nn.Module, checkpoint_format: str, group: _Group) -> None:
    if checkpoint_format in ("safetensors", "safetensors_dcp"):
        full: dict[str, Any] = get_model_state_dict(model, options=_FULL_ON_MAIN)  # collective gather
        if group.is_main:
            write_safetensors(layout.join(model_dir, layout.MODEL_SAFETENSORS), full, {"format": "pt"})
    if checkpoint_format in ("dcp", "safetensors_dcp"):
        _dcp_save(get_model_state_dict(model), layout.join(model_dir, layout.MODEL_DCP_DIR), group)


def adapter_keys(model: nn.Module) -> dict[str, str]:
    """Trainable parameter name -> the key its tensor has in an adapter file (peft's naming)."""
    return {name: peft_key(name) for name, param in model.named_parameters() if param.requires_grad}


def _save_adapter(model_dir: str, model: nn.Module, checkpoint_format: str, group: _Group) -> None:
    keys = adapter_keys(model)
    if not keys:
        raise ValueError("adapter_config was given but the model has no trainable parameters to save")
    if checkpoint_format in ("safetensors", "safetensors_dcp"):
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        full: dict[str, Any] = get_model_state_dict(model, options=options)  # collective: trainable part
        if group.is_main:
            adapter = {keys[name]: full[name] for name in keys}
            write_safetensors(layout.join(model_dir, layout.ADAPTER_SAFETENSORS), adapter, {"format": "pt"})
    if checkpoint_format in ("dcp", "safetensors_dcp"):
        sharded = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=True))
        _dcp_save(
            {keys[name]: sharded[name] for name in keys},
            layout.join(model_dir, layout.ADAPTER_DCP_DIR),
            group,
        )


def _save_optimizer(
    state_dir: str, model: nn.Module, optimizer: torch.optim.Optimizer, group: _Group
) -> None:
    if is_sharded(model):
        osd = get_optimizer_state_dict(model, optimizer)
        _dcp_save(osd, layout.join(state_dir, layout.OPTIMIZER_DCP_DIR), group)
        return
    osd = get_optimizer_state_dict(model, optimizer, options=_FULL_ON_MAIN)
    if group.is_main:
        tensors, param_groups, extras = _flatten_optimizer(osd)
        meta = {"state_extras": json.dumps(extras)} if extras else None
        write_safetensors(layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS), tensors, meta)
        _write_json(layout.join(state_dir, layout.OPTIMIZER_PARAM_GROUPS), param_groups)


def _write_side_files(
    step_dir: str,
    training_step: TrainingStep,
    policy_config: dict[str, Any],
    train_config: dict[str, Any],
    processors: Mapping[str, ProcessorState] | None,
    scheduler: Any,
    scaler: Any,
    adapter_config: Mapping[str, Any] | None = None,
) -> None:
    model_dir = layout.join(step_dir, layout.PRETRAINED_MODEL_DIR)
    state_dir = layout.join(step_dir, layout.TRAINING_STATE_DIR)
    _write_json(layout.join(model_dir, layout.POLICY_CONFIG), policy_config)
    if adapter_config is not None:
        _write_json(layout.join(model_dir, layout.ADAPTER_CONFIG), dict(adapter_config))
    _write_json(layout.join(model_dir, layout.TRAIN_CONFIG), train_config)
    for name, processor in (processors or {}).items():
        _write_json(layout.join(model_dir, layout.processor_config_name(name)), processor.config)
        for index, tensors in enumerate(processor.step_tensors):
            write_safetensors(layout.join(model_dir, layout.processor_step_name(name, index)), tensors)
    storage.write_text(layout.join(state_dir, layout.TRAINING_STEP), training_step.to_json())
    if scheduler is not None:
        _write_json(layout.join(state_dir, layout.SCHEDULER_STATE), scheduler.state_dict())
    if scaler is not None and scaler.state_dict():  # a disabled GradScaler has no state
        _write_json(layout.join(state_dir, layout.SCALER_STATE), scaler.state_dict())


def write_safetensors(
    path: str, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write one safetensors file (local path or fsspec URL). Tensors sharing memory (tied weights)
    are copied, since the format stores each tensor on its own."""
    from safetensors.torch import save, save_file

    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if ptr in seen and tensor.numel() else tensor
        seen.add(ptr)
    fs, inner = storage.resolve(path)
    if storage.is_local(fs):
        save_file(out, inner, metadata=metadata)
    else:
        storage.write_bytes(path, save(out, metadata=metadata))


def _write_json(path: str, data: Any) -> None:
    storage.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _dcp_save(state_dict: dict[str, Any], path: str, group: _Group) -> None:
    with quiet_single_process():
        dcp.save(
            state_dict,
            storage_writer=_dcp_writer(path),
            process_group=group.pg,
            no_dist=not group.distributed,
        )


def _dcp_load(state_dict: dict[str, Any], path: str, group: _Group) -> None:
    """Collective: fill `state_dict` in place from a DCP directory, resharding onto its tensors."""
    with quiet_single_process():
        dcp.load(
            state_dict, storage_reader=dcp_reader(path), process_group=group.pg, no_dist=not group.distributed
        )


@contextlib.contextmanager
def quiet_single_process() -> Iterator[None]:
    """Silence DCP's warning that it runs without a process group: in one process that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninit")
        yield


def _dcp_writer(path: str) -> dcp.StorageWriter:
    if "://" in path:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # not re-exported

        return FsspecWriter(path)
    return dcp.FileSystemWriter(path)


def dcp_reader(path: str) -> dcp.StorageReader:
    """A DCP reader for a local directory or an fsspec URL."""
    if "://" in path:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # not re-exported

        return FsspecReader(path)
    return dcp.FileSystemReader(path)


# --------------------------------------------------------------------------- optimizer as safetensors
# Tensors are keyed `state/<param fqn>/<name>` (exp_avg, step, ...) and `param_groups/<i>/<key>` for a
# tensor-valued hyperparameter; the JSON file is the list of param groups with `params` as names.


def _flatten_optimizer(osd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]], dict]:
    tensors: dict[str, torch.Tensor] = {}
    extras: dict[str, dict[str, Any]] = {}  # non-tensor per-parameter values (SGD's None buffer)
    for fqn, param_state in osd["state"].items():
        for name, value in param_state.items():
            if torch.is_tensor(value):
                tensors[f"state/{fqn}/{name}"] = value
            else:
                extras.setdefault(fqn, {})[name] = value
    groups = []
    for index, group in enumerate(osd["param_groups"]):
        plain = {}
        for key, value in group.items():
            if torch.is_tensor(value):
                tensors[f"param_groups/{index}/{key}"] = value
            else:
                plain[key] = value
        groups.append(plain)
    return tensors, groups, extras


def read_optimizer_safetensors(state_dir: str, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """The name-keyed optimizer state dict of a non-sharded run. JSON has no tuples: a list is turned
    back into a tuple where `optimizer`'s own value is one (AdamW's betas), so the round trip is exact."""
    from ckpt_tools.loading import read_safetensors

    tensors, metadata = read_safetensors(layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS))
    groups = _read_json(layout.join(state_dir, layout.OPTIMIZER_PARAM_GROUPS))
    state: dict[str, dict[str, Any]] = json.loads(metadata.get("state_extras", "{}"))
    for key, tensor in tensors.items():
        kind, rest = key.split("/", 1)
        owner, name = rest.rsplit("/", 1)
        if kind == "state":
            state.setdefault(owner, {})[name] = tensor
        else:
            groups[int(owner)][name] = tensor
    if optimizer is not None:
        _restore_tuples(groups, optimizer.param_groups)
    return {"state": state, "param_groups": groups}


def _restore_tuples(groups: list[dict[str, Any]], like: list[dict[str, Any]]) -> None:
    """Turn lists back into tuples where `like` (the live optimizer's groups) holds a tuple."""
    for group, live in zip(groups, like, strict=False):
        for key, value in group.items():
            if isinstance(value, list) and isinstance(live.get(key), tuple):
                group[key] = tuple(value)


# ---------------------------------------------------------------------------------------------- RNG


def save_rng_state(
    step_dir: str | os.PathLike[str],
    rank: int,
    world_size: int,
    *,
    process_group: dist.ProcessGroup | None = None,
) -> None:
    """Collective when world_size > 1: gather every rank's python, numpy, torch CPU (+ CUDA) RNG
    state to rank 0, which writes `training_state/rng_state.safetensors`.

    Keys are `rank<r>/python`, `rank<r>/numpy`, `rank<r>/torch`, `rank<r>/cuda/<device>`; the scalar
    parts of the python and numpy states, and `world_size`, are in the file's metadata.
    """
    mine = _rng_snapshot(rank)
    if world_size > 1:
        gathered: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, gathered, group=process_group, group_dst=0)
    else:
        gathered = [mine]
    if rank != 0 or gathered is None:
        return
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"world_size": str(world_size)}
    for snapshot_tensors, snapshot_meta in gathered:
        tensors.update(snapshot_tensors)
        metadata.update(snapshot_meta)
    path = layout.join(os.fspath(step_dir), layout.TRAINING_STATE_DIR, layout.RNG_STATE)
    write_safetensors(path, tensors, metadata)


def _rng_snapshot(rank: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    prefix = f"rank{rank}/"
    version, words, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    tensors = {
        prefix + "python": torch.tensor(words, dtype=torch.int64),
        prefix + "numpy": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        prefix + "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        for device, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"{prefix}cuda/{device}"] = state
    metadata = {
        prefix + "python": json.dumps([version, gauss]),
        prefix + "numpy": json.dumps([np_name, int(np_pos), int(np_has_gauss), float(np_gauss)]),
    }
    return tensors, metadata


def load_rng_state(step_dir: str | os.PathLike[str], rank: int, world_size: int) -> None:
    """Restore this rank's RNG state from `rng_state.safetensors` (reads the file; no collective).

    Rank r takes saved rank `r % saved_world_size`. When the current run has more ranks than the saved
    one, a rank r >= saved_world_size then re-seeds python, numpy and torch (CPU and CUDA) with a seed
    derived from that saved torch state and r, so the added ranks draw distinct, reproducible streams.
    """
    from ckpt_tools.loading import read_safetensors

    step, _ = storage.resolve_model_dir(step_dir)
    if step is None:
        raise NotACheckpointError(f"{os.fspath(step_dir)} has no training_state/; pass a step directory")
    path = layout.join(step, layout.TRAINING_STATE_DIR, layout.RNG_STATE)
    tensors, metadata = read_safetensors(path)
    saved_world = int(metadata.get("world_size", "0"))
    if saved_world < 1:
        raise CorruptCheckpointError(f"{path}: metadata has no world_size; the file is damaged")
    prefix = f"rank{rank % saved_world}/"
    version, gauss = json.loads(metadata[prefix + "python"])
    random.setstate((version, tuple(tensors[prefix + "python"].tolist()), gauss))
    np_name, np_pos, np_has_gauss, np_gauss = json.loads(metadata[prefix + "numpy"])
    np_keys = tensors[prefix + "numpy"].numpy().astype(np.uint32)
    np.random.set_state((np_name, np_keys, np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(tensors[prefix + "torch"])
    if torch.cuda.is_available():
        for device in range(torch.cuda.device_count()):
            key = f"{prefix}cuda/{device}"
            if key in tensors:
                torch.cuda.set_rng_state(tensors[key], device)
    if rank >= saved_world:
        digest = hashlib.sha256(tensors[prefix + "torch"].numpy().tobytes() + rank.to_bytes(8, "little"))
        seed = int.from_bytes(digest.digest()[:8], "little") >> 1
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------------- load


def load_training_state(
    step_dir: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    process_group: dist.ProcessGroup | None = None,
) -> None:
    """Collective: call on all ranks after the model and optimizer are prepared (phase 2 of a resume).

    Loads whatever format the step holds into the current topology. DCP shards are resharded by torch
    (N -> M ranks, FSDP2 <-> HSDP, sharded -> DDP/plain). Safetensors weights and a non-sharded run's
    `optimizer_state.safetensors` are full state dicts: every rank reads them and keeps its own shard.
    A sharded run's checkpoint without `optimizer_0/` (an older release's gathered optimizer) is
    refused with `LegacyCheckpointError`. `step_dir` may also be `last` or an output_dir.
    """
    group = _Group(process_group)
    step, model_dir = storage.resolve_model_dir(step_dir)
    if step is None:
        raise NotACheckpointError(f"{os.fspath(step_dir)} has no training_state/; pass a step directory")
    saved = read_training_step(step)
    state_dir = layout.join(step, layout.TRAINING_STATE_DIR)
    _load_model(model_dir, model, group)
    if optimizer is not None:
        _load_optimizer(state_dir, saved, model, optimizer, group)
    if scheduler is not None:
        scheduler.load_state_dict(_read_json(layout.join(state_dir, layout.SCHEDULER_STATE)))
    if scaler is not None and storage.exists(layout.join(state_dir, layout.SCALER_STATE)):
        scaler.load_state_dict(_read_json(layout.join(state_dir, layout.SCALER_STATE)))


def _load_model(model_dir: str, model: nn.Module, group: _Group) -> None:
    from ckpt_tools.loading import read_safetensors_model, validate_dcp_metadata

    if storage.exists(layout.join(model_dir, layout.ADAPTER_CONFIG)):
        _load_adapter(model_dir, model, group)
        return
    dcp_dir = layout.join(model_dir, layout.MODEL_DCP_DIR)
    has_dcp = storage.exists(layout.join(dcp_dir, layout.DCP_METADATA))
    has_full = storage.exists(layout.join(model_dir, layout.MODEL_SAFETENSORS)) or storage.exists(
        layout.join(model_dir, layout.MODEL_INDEX)
    )
    sharded = is_sharded(model)
    if has_dcp and (sharded or not has_full):
        validate_dcp_metadata(dcp_dir)
        state = get_model_state_dict(model)
        _dcp_load(state, dcp_dir, group)
        set_model_state_dict(model, state)
    elif has_full:
        full: dict[str, Any] = read_safetensors_model(model_dir)
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=sharded))
    else:
        raise NotACheckpointError(
            f"{model_dir} holds no model weights ({layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX} or "
            f"{layout.MODEL_DCP_DIR}/); the checkpoint is incomplete"
        )


def _load_adapter(model_dir: str, model: nn.Module, group: _Group) -> None:
    """Load a PEFT checkpoint's adapter into the model's trainable parameters (the base stays as built)."""
    from ckpt_tools.loading import read_safetensors, validate_dcp_metadata

    keys = adapter_keys(model)
    dcp_dir = layout.join(model_dir, layout.ADAPTER_DCP_DIR)
    has_dcp = storage.exists(layout.join(dcp_dir, layout.DCP_METADATA))
    has_file = storage.exists(layout.join(model_dir, layout.ADAPTER_SAFETENSORS))
    sharded = is_sharded(model)
    state: dict[str, Any]
    if has_dcp and (sharded or not has_file):
        validate_dcp_metadata(dcp_dir)
        saved = set(dcp_reader(dcp_dir).read_metadata().state_dict_metadata)
        _check_adapter_keys(model_dir, saved, keys)
        local = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=True))
        state = {keys[name]: local[name] for name in keys}
        _dcp_load(state, dcp_dir, group)
        full_state = False
    elif has_file:
        state, _ = read_safetensors(layout.join(model_dir, layout.ADAPTER_SAFETENSORS))
        _check_adapter_keys(model_dir, set(state), keys)
        full_state = sharded
    else:
        raise NotACheckpointError(
            f"{model_dir} has {layout.ADAPTER_CONFIG} but no adapter weights ({layout.ADAPTER_SAFETENSORS} or "
            f"{layout.ADAPTER_DCP_DIR}/); the checkpoint is incomplete"
        )
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
    state_dir: str, saved: TrainingStep, model: nn.Module, optimizer: torch.optim.Optimizer, group: _Group
) -> None:
    from ckpt_tools.loading import validate_dcp_metadata

    dcp_dir = layout.join(state_dir, layout.OPTIMIZER_DCP_DIR)
    if storage.exists(layout.join(dcp_dir, layout.DCP_METADATA)):
        validate_dcp_metadata(dcp_dir)
        osd = get_optimizer_state_dict(model, optimizer)
        _dcp_load(osd, dcp_dir, group)
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
    osd = read_optimizer_safetensors(state_dir, optimizer)
    before = [dict(group) for group in optimizer.param_groups]
    options = StateDictOptions(full_state_dict=is_sharded(model))
    set_optimizer_state_dict(model, optimizer, osd, options=options)
    _restore_tuples(optimizer.param_groups, before)  # torch's full-state path flattens tuples to lists


def _read_json(path: str) -> Any:
    try:
        return json.loads(storage.read_text(path))
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointError(f"{path} is not valid JSON ({exc}); the file is damaged") from exc
