"""Collective save of a run's state: model (or PEFT adapter), optimizer, RNG, scheduler, scaler,
processors, configs.

One code path serves a plain model, DDP and FSDP2/HSDP: `torch.distributed.checkpoint.state_dict`
returns state dicts keyed by parameter names (no `module.` prefix, no optimizer parameter ids)
whatever the wrapping, with DTensors on a sharded model. Full tensors are gathered where the format
wants one file (only the main rank of the group writes it); DCP directories are written by every rank.

A step is written under `checkpoints/.tmp-<step>/` and committed when complete (`commit.py`), with
`verify_checkpoint` as the completeness check of the step `last` falls back to. docs/format.md is the
spec of every file written here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful  # state_dict() and load_state_dict()

from ckpt_tools.errors import SaveFailedError, UsageError
from ckpt_tools.files import commit, storage
from ckpt_tools.files.digest import Recorder
from ckpt_tools.files.manifest import write_bytes, write_json, write_manifest
from ckpt_tools.files.sharded_safetensors import parse_size
from ckpt_tools.format import layout, weight_sets
from ckpt_tools.format.meta import CheckpointFormat, TrainingStep
from ckpt_tools.reports.verify import verify_checkpoint
from ckpt_tools.state.adapters import adapter_keys
from ckpt_tools.state.collective import Group, is_sharded
from ckpt_tools.state.gathered_write import write_gathered_safetensors
from ckpt_tools.state.optim_codec import write_optimizer_safetensors
from ckpt_tools.state.processor_state import ProcessorState, check_processors, write_processors
from ckpt_tools.state.rng import RngSnapshot, rng_snapshot, write_rng_state
from ckpt_tools.tensors.tensor_io import dcp_async_save, dcp_save, dcp_stage, write_safetensors

WriteDcp = Callable[[dict[str, Any], str], None]  # writes a state dict as a DCP directory


@dataclass(frozen=True, kw_only=True, eq=False)
class SaveRequest:
    """One step's save: what it writes and how, the one argument of `start_checkpoint` and
    `save_checkpoint`. Frozen (`dataclasses.replace` derives another step's request) and compared by
    identity, as the live model and optimizer it holds are."""

    checkpoints_dir: str | os.PathLike[str]
    """The run's `checkpoints/` directory (a local path or an fsspec URL): the step is written under it
    as `<step:06d>/`."""
    training_step: TrainingStep
    """The step's `training_step.json`; its `checkpoint_format` says how the weights go out: `safetensors`
    gathers the full (fp32 master) weights into `model.safetensors`, `dcp` writes `pytorch_model_fsdp_0/`
    from every rank, `safetensors_dcp` both."""
    model: nn.Module
    """The prepared model (plain, DDP-wrapped, or FSDP2/HSDP-sharded)."""
    optimizer: torch.optim.Optimizer
    """Saved as DCP (`optimizer_0/`) on a sharded model, else `optimizer_state.safetensors` +
    `optimizer_param_groups.json`."""
    policy_config: dict[str, Any]
    """`pretrained_model/config.json`."""
    train_config: dict[str, Any]
    """`pretrained_model/train_config.json`."""
    processors: Mapping[str, ProcessorState] | None = None
    """The policy's processors, keyed `layout.PREPROCESSOR` / `layout.POSTPROCESSOR`."""
    scheduler: Stateful | None = None
    scaler: Stateful | None = None
    process_group: dist.ProcessGroup | None = None
    """The group that saves (the default group when None)."""
    adapter_config: Mapping[str, Any] | None = None
    """A PEFT run's (peft's config as JSON, `base_model_name_or_path` included): the weights saved are
    then only the trainable ones, under peft's key names (`peft_key`), as `adapter_model.safetensors`
    and/or `adapter_model_fsdp_0/` by the same format rule, beside `adapter_config.json`; the frozen base
    is not written."""
    keep_last: int = 0
    """K > 0: at `finish()`, delete all but the K newest steps (`commit.prune_steps`)."""
    manifest: bool = True
    """Write `manifest.json`: every file's size and sha256, hashed from the bytes as they are written (each
    rank its own shards, gathered to the main rank), which `ckpt verify --deep` checks. Gathered files
    are written tensor by tensor, hashed as they pass (`gathered_write.py`): no process holds a second
    copy of the model."""
    background: bool = False
    """Stage (copy) the DCP parts (a sharded run's optimizer, DCP weights) now and write them with DCP's
    async save in background threads, so training can go on; `PendingCheckpoint.written()` says whether
    this rank's writes are done, and `finish()` waits for them. The other parts (gathered files, side
    files) are written before `start_checkpoint` returns."""
    extra_weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None
    """The weight sets saved beside the model, by name (format/weight_sets.py; today `ema`, a run's EMA
    shadow): each maps parameter names (the model's state-dict names) to tensors sharded like the
    parameters (DTensors on a sharded model, the same on every rank otherwise), and is written by the
    model's format rule into its own files (`ema.safetensors` gathered and/or `ema_dcp/` from every
    rank), so a resume reshards it like the weights and a reader loads it like them. A PEFT run's set (of
    its trainable parameters) is saved under the adapter's key names (`peft_key`), so it stands in for
    the adapter file as a full model's stands in for the model file."""
    shard_size: int | str | None = None
    """`5GB`, `500MiB` or bytes: the gathered model weights as Hugging Face style shards of at most that
    size (`model-0000k-of-0000n.safetensors` and `model.safetensors.index.json`, split as huggingface_hub
    splits) instead of one `model.safetensors`; the adapter and the EMA stay one file."""


def start_checkpoint(request: SaveRequest, /) -> PendingCheckpoint:
    """Collective: call on all ranks. Write `<checkpoints_dir>/<step:06d>/` as `request` says;
    `finish()` on the result (collective) moves `last` to it and applies `keep_last`.
    `save_checkpoint` is both at once.

    Every rank's RNG state, as it is now, is gathered into `rng_state.safetensors` at `finish()`. A
    failure of the main rank's own writing (gathered files, side files, commit, retention) or of any
    rank's DCP shard write raises the same one-line `SaveFailedError` on every rank, at once.
    """
    max_size = parse_size(request.shard_size, "shard_size") if request.shard_size is not None else None
    group = Group(request.process_group)
    recorder = Recorder() if request.manifest else None
    check_processors(request.processors)
    extras = [(weight_sets.extra(name), state) for name, state in (request.extra_weights or {}).items()]
    root = os.fspath(request.checkpoints_dir).rstrip("/")
    step, checkpoint_format = request.training_step.step, request.training_step.checkpoint_format
    pending = PendingCheckpoint(group, root, step, request.keep_last, recorder, rng_snapshot(group.rank))
    tmp = commit.tmp_step_dir(root, step)
    group.on_main(_begin, root, step)
    group.agree(pending.what)  # nobody writes before the directory exists
    write_dcp = pending.background_writer() if request.background else pending.writer()
    model_dir = layout.join(tmp, layout.PRETRAINED_MODEL_DIR)
    with _shard_failures(pending.what):
        if request.adapter_config is None:
            _save_model(model_dir, request.model, checkpoint_format, group, recorder, write_dcp, max_size)
        else:
            _save_adapter(model_dir, request.model, checkpoint_format, group, recorder, write_dcp)
        for kind, state in extras:
            saved = _peft_names(state, request.model) if request.adapter_config is not None else state
            _save_extra(model_dir, kind, saved, checkpoint_format, group, recorder, write_dcp)
        _save_optimizer(
            layout.join(tmp, layout.TRAINING_STATE_DIR),
            request.model,
            request.optimizer,
            group,
            recorder,
            write_dcp,
        )
        pending.launch()
    group.on_main(_write_side_files, tmp, request, recorder)
    return pending


def save_checkpoint(request: SaveRequest, /) -> str:
    """Collective: call on all ranks. `start_checkpoint(request).finish()`: write
    `<checkpoints_dir>/<step:06d>/`, move `last` to it, apply `keep_last`; returns the step directory."""
    return start_checkpoint(request).finish()


class PendingCheckpoint:
    """A step written (or being written in the background) under `.tmp-<step>`, not yet committed."""

    def __init__(
        self,
        group: Group,
        root: str,
        step: int,
        keep_last: int,
        recorder: Recorder | None,
        rng: RngSnapshot,
    ) -> None:
        self.group, self.root, self.step, self.keep_last, self.recorder = (
            group,
            root,
            step,
            keep_last,
            recorder,
        )
        self.rng = rng  # this rank's RNG state at the save, gathered by `finish`
        self.what = f"saving checkpoint step {step}"
        self._futures: list[Any] = []
        self._staged: list[tuple[dict[str, Any], str]] = []

    def writer(self) -> WriteDcp:
        """Write each DCP part now. On the default group each part gets a thread and a gloo group of its
        own (`background_group`): the model's and the optimizer's DCP saves, and the side files that
        follow on the calling thread, then overlap instead of queueing (each DCP save is mostly waiting:
        on its planning collectives, on its file syncs). `finish` joins them. The threads are kept from
        one save to the next (`_save_pool`). On a caller's own process group the parts are written one
        after the other on that group."""
        group, recorder = self.group, self.recorder
        if group.pg is not None:
            return lambda state, path: dcp_save(state, path, group.pg, group.distributed, recorder)
        if group.distributed:
            background_group(MAX_DCP_PARTS - 1)  # collective: every group exists before any thread runs
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        pool = _save_pool()

        def write(state: dict[str, Any], path: str, pg: Any) -> None:
            if device is not None:  # a new thread starts on cuda:0, not on this rank's device
                torch.cuda.set_device(device)
            dcp_save(state, path, pg, group.distributed, recorder)

        def submit(state: dict[str, Any], path: str) -> None:
            pg = background_group(len(self._futures)) if group.distributed else None
            self._futures.append(pool.submit(write, state, path, pg))

        return submit

    def background_writer(self) -> WriteDcp:
        """Stage each DCP part now; `launch` writes them with DCP's async save."""
        return lambda state, path: self._staged.append((dcp_stage(state, path), path))

    def launch(self) -> None:
        """Start the background writes once every part is staged (so the writes' threads do not compete
        with the copies), each on a gloo group of its own (the training's collectives keep the main
        group; two background threads never share one)."""
        distributed = self.group.distributed
        for index, (staged, path) in enumerate(self._staged):
            pg = background_group(index) if distributed else None
            self._futures.append(dcp_async_save(staged, path, pg, distributed, self.recorder))
        self._staged.clear()

    def written(self) -> bool:
        """Whether this rank's background writes are done (a local check, no collective)."""
        return all(future.done() for future in self._futures)

    def finish(self, keep: Collection[str] = ()) -> str:
        """Collective: wait for every background write, then commit, move `last` and apply retention,
        which spares the step names in `keep` (the main rank's are used). Raises `SaveFailedError` on
        every rank when any part failed (the step is then not committed)."""
        group, root, step, recorder = self.group, self.root, self.step, self.recorder
        tmp = commit.tmp_step_dir(root, step)
        with _shard_failures(self.what):
            for future in self._futures:
                future.result()
        # Every rank's shards are on disk before the directory becomes visible: the one gather of every
        # rank's RNG state and manifest entries is that barrier (a rank sends them once its writes are
        # done), and a failure so far stops the main rank's commit and reaches every rank at the last
        # agree.
        entries = recorder.entries() if recorder is not None else None  # this rank's, hashed as written
        gathered = group.gather_to_main((self.rng, entries))
        group.on_main(self._write_gathered, tmp, gathered)
        what = self.what if group.failure is not None else f"committing checkpoint step {step}"
        group.on_main(lambda: commit.commit_step_dir(tmp, root, step, is_complete=_verifies))
        group.on_main(commit.prune_steps, root, self.keep_last, keep)
        group.agree(what)  # nobody reads `last` before it
        return layout.join(root, layout.step_dir_name(step))

    def _write_gathered(self, tmp: str, gathered: list[tuple[RngSnapshot, Any]]) -> None:
        """The main rank's part after the gather: `rng_state.safetensors`, then the manifest of every
        rank's files and its own (the RNG file included)."""
        write_rng_state(tmp, [rng for rng, _ in gathered], self.recorder)
        if self.recorder is not None:
            files = {k: v for _, entries in gathered[1:] for k, v in entries.items()}
            write_manifest(tmp, files | self.recorder.entries())


MAX_DCP_PARTS = 3  # DCP directories one step writes: the weights (or adapter), the EMA and the optimizer
_BACKGROUND_GROUPS: dict[Any, list[Any]] = {}  # the current default process group -> its DCP write groups
_SAVE_POOL: list[ThreadPoolExecutor] = []  # the threads of `writer`, made once per process


def _save_pool() -> ThreadPoolExecutor:
    """The threads that write a save's DCP parts, made at the first save and kept: starting two
    threads per save costs milliseconds of the training stall on a busy machine."""
    if not _SAVE_POOL:
        _SAVE_POOL.append(ThreadPoolExecutor(MAX_DCP_PARTS, thread_name_prefix="ckpt-save"))
    return _SAVE_POOL[0]


def prepare_save_groups(timeout: timedelta | None = None) -> None:
    """Collective when a process group is up: create the gloo groups of the DCP writes now. A new group
    needs the rendezvous store, which under torchrun lives in the launcher: created at the first save, it
    could not be by ranks whose launcher has died, and those must still save before they stop. `timeout`
    bounds each of their collectives (give the run's collective timeout: torch's default for a new group
    is 30 minutes, so a rank stalled in a save would otherwise hold the others that long)."""
    if dist.is_available() and dist.is_initialized():
        background_group(MAX_DCP_PARTS - 1, timeout)


def background_group(index: int, timeout: timedelta | None = None) -> Any:
    """The `index`-th gloo group for DCP writes off the calling thread, created on first use
    (collective: every rank reaches the same save in the same order). Groups of a process group that
    has since been destroyed and re-created are dropped, not reused."""
    world = dist.group.WORLD
    if world not in _BACKGROUND_GROUPS:
        _BACKGROUND_GROUPS.clear()
        _BACKGROUND_GROUPS[world] = []
    groups = _BACKGROUND_GROUPS[world]
    while len(groups) <= index:
        groups.append(dist.new_group(backend="gloo", timeout=timeout))
    return groups[index]


def _begin(root: str, step: int) -> None:
    tmp = commit.begin_step_dir(root, step)
    storage.makedirs(layout.join(tmp, layout.PRETRAINED_MODEL_DIR))
    storage.makedirs(layout.join(tmp, layout.TRAINING_STATE_DIR))


@contextlib.contextmanager
def _shard_failures(what: str) -> Iterator[None]:
    """A rank's failed DCP shard write: torch's DCP gathers every rank's outcome and raises its
    (multi-line) CheckpointException on all ranks; make it the one-line SaveFailedError."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:  # a BaseException
        ranks = sorted(exc.failures)
        first = exc.failures[ranks[0]]
        cause = first[0] if isinstance(first, tuple) else first
        detail = " ".join(str(cause).split())[:200]
        raise SaveFailedError(
            f"{what} failed: rank {', '.join(map(str, ranks))} could not write its shards "
            f"({type(cause).__name__}: {detail})"
        ) from None


def _verifies(step_dir: str) -> bool:
    """The completeness check of a step `last` may fall back to: it verifies."""
    return verify_checkpoint(step_dir).ok


def _save_model(
    model_dir: str,
    model: nn.Module,
    checkpoint_format: str,
    group: Group,
    recorder: Recorder | None,
    write_dcp: WriteDcp,
    shard_size: int | None,
) -> None:
    if CheckpointFormat(checkpoint_format).has_safetensors:  # gathered tensor by tensor, no full copy
        path = layout.join(model_dir, layout.MODEL_SAFETENSORS)
        state: dict[str, Any] = get_model_state_dict(model)  # DTensors on a sharded model: nothing gathered
        write_gathered_safetensors(path, state, group, recorder, shard_size)
    if CheckpointFormat(checkpoint_format).has_dcp:
        write_dcp(get_model_state_dict(model), layout.join(model_dir, layout.MODEL_DCP_DIR))


def _save_adapter(
    model_dir: str,
    model: nn.Module,
    checkpoint_format: str,
    group: Group,
    recorder: Recorder | None,
    write_dcp: WriteDcp,
) -> None:
    keys = adapter_keys(model)
    if not keys:
        raise UsageError("adapter_config was given but the model has no trainable parameters to save")
    if CheckpointFormat(checkpoint_format).has_safetensors:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        full: dict[str, Any] = get_model_state_dict(model, options=options)  # collective: trainable part
        path = layout.join(model_dir, layout.ADAPTER_SAFETENSORS)
        group.on_main(
            lambda: write_safetensors(
                path, {keys[name]: full[name] for name in keys}, {"format": "pt"}, recorder
            )
        )
    if CheckpointFormat(checkpoint_format).has_dcp:
        sharded = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=True))
        write_dcp(
            {keys[name]: sharded[name] for name in keys}, layout.join(model_dir, layout.ADAPTER_DCP_DIR)
        )


def _save_extra(
    model_dir: str,
    kind: weight_sets.WeightSetKind,
    state: Mapping[str, torch.Tensor],
    checkpoint_format: str,
    group: Group,
    recorder: Recorder | None,
    write_dcp: WriteDcp,
) -> None:
    """A weight set beside the model (the EMA shadow), written as the model is: gathered into its file
    tensor by tensor (`full_tensor`, collective per sharded tensor, in the same order on every rank)
    and/or as DCP shards from every rank."""
    if CheckpointFormat(checkpoint_format).has_safetensors:
        write_gathered_safetensors(layout.join(model_dir, kind.safetensors), state, group, recorder)
    if CheckpointFormat(checkpoint_format).has_dcp:
        write_dcp(dict(state), layout.join(model_dir, kind.dcp_dir))


def _peft_names(state: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A PEFT run's weight set under the adapter file's key names."""
    keys = adapter_keys(model)
    return {keys[name]: value for name, value in state.items()}


def _save_optimizer(
    state_dir: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    group: Group,
    recorder: Recorder | None,
    write_dcp: WriteDcp,
) -> None:
    if is_sharded(model):
        write_dcp(_optimizer_state(model, optimizer), layout.join(state_dir, layout.OPTIMIZER_DCP_DIR))
        return
    osd = _optimizer_state(model, optimizer)  # plain tensors: the state itself, no gathered copy
    group.on_main(write_optimizer_safetensors, state_dir, osd, recorder)


def _optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, options: StateDictOptions | None = None
) -> dict[str, Any]:
    """The optimizer's state dict, without changing a never-stepped optimizer. torch's helper creates
    the missing state by running a step at learning rate 0, which AdamW counts as its first step: the
    first real update would then come out smaller than in a run that never saved (bias correction of
    step 2). Such an optimizer (its first updates skipped by an fp16 loss scaler, or stopped at step 1)
    is left without state and saved with none, which a resume restores as it is."""
    never_stepped = not optimizer.state
    osd: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=options)
    if never_stepped:
        optimizer.state.clear()
        if osd:  # empty on the ranks that do not write a gathered state
            osd["state"] = {}
    return osd


def _write_side_files(step_dir: str, request: SaveRequest, recorder: Recorder | None) -> None:
    """The main rank's files beside the weights: the configs, the processors, `training_step.json`, the
    scheduler's and the scaler's state."""
    model_dir = layout.join(step_dir, layout.PRETRAINED_MODEL_DIR)
    state_dir = layout.join(step_dir, layout.TRAINING_STATE_DIR)
    write_json(layout.join(model_dir, layout.POLICY_CONFIG), request.policy_config, recorder)
    if request.adapter_config is not None:
        write_json(layout.join(model_dir, layout.ADAPTER_CONFIG), dict(request.adapter_config), recorder)
    write_json(layout.join(model_dir, layout.TRAIN_CONFIG), request.train_config, recorder)
    write_processors(model_dir, request.processors, recorder)
    path = layout.join(state_dir, layout.TRAINING_STEP)
    write_bytes(path, request.training_step.to_json().encode("utf-8"), recorder)
    if request.scheduler is not None:
        write_json(layout.join(state_dir, layout.SCHEDULER_STATE), request.scheduler.state_dict(), recorder)
    if request.scaler is not None and request.scaler.state_dict():  # a disabled GradScaler has no state
        write_json(layout.join(state_dir, layout.SCALER_STATE), request.scaler.state_dict(), recorder)
